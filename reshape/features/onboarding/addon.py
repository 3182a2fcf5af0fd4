"""The onboarding site through the proxy, at a well-known name (as mitmproxy answers at mitm.it).

`http://reshape.internal/` (and `https://`, once the CA is trusted) is answered by the proxy
itself: the `requestheaders` hook sets `flow.response`, so no origin connection is ever made and
the name need not resolve anywhere (`.internal` is reserved for private use and never resolves on
the public internet). Answering from the head, before the `request` hook, also spares the addons
that check destinations (destinations/) a DNS lookup of a name that is not there.

A CONNECT to the name is accepted without connecting anywhere (mitmproxy's eager strategy would
otherwise try the name at CONNECT time and answer 502), and TLS with the client starts without
waiting for a server that does not exist.

mitmproxy's own onboarding addon is a Flask app that reads the CA files from confdir and is
written for mitmproxy's names; this one serves reshape's page (page.py) and downloads made from
the CA in memory, and is the same site the admin endpoint serves (site.py).
"""

from __future__ import annotations

import logging
import time

from mitmproxy import http, tls

from reshape.base.addresses import ListenAddress
from reshape.base.own_answers import answer_to
from reshape.features.onboarding.site import OnboardingSite, reachable_at

log = logging.getLogger("reshape.onboarding")

ONBOARDING_HOST = "reshape.internal"


def _text(status: int, message: str) -> http.Response:
    return http.Response.make(
        status, message, {"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store"}
    )


class Onboarding:
    def __init__(
        self, site: OnboardingSite, admin: ListenAddress | None, host: str = ONBOARDING_HOST
    ) -> None:
        """`admin`: the admin endpoint, whose PAC file the page names when the client can
        reach it."""
        self.site = site
        self.admin = admin
        self.host = host.lower()

    def _is_ours(self, host: str | None) -> bool:
        return host is not None and host.lower().rstrip(".") == self.host

    def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not self._is_ours(flow.request.host):
            return
        # What mitmproxy itself answers once it has connected; here nothing is connected.
        flow.response = http.Response(
            flow.request.data.http_version,
            200,
            b"Connection established",
            http.Headers(),
            b"",
            None,
            time.time(),
            time.time(),
        )

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        address = data.context.server.address
        if address is not None and self._is_ours(address[0]):
            data.establish_server_tls_first = False  # there is no server

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not self._is_ours(flow.request.pretty_host):
            return
        flow.request.stream = False  # answered here: a body to stream has nowhere to go
        method = flow.request.method
        if method not in ("GET", "HEAD"):
            flow.response = _text(405, "reshape onboarding: GET only\n")
            flow.response.headers["Allow"] = "GET, HEAD"
            return
        reached_host, reached_port = flow.client_conn.sockname[:2]
        admin = reachable_at(self.admin, reached_host) if self.admin is not None else None
        reply = self.site.reply(
            flow.request.path.split("?", 1)[0],
            proxy=str(ListenAddress(reached_host, reached_port)),
            pac_url=f"http://{admin}/proxy.pac" if admin is not None else None,
        )
        if reply is None:
            paths = " ".join(self.site.paths)
            flow.response = answer_to(
                flow.request, _text(404, f"reshape onboarding: not found; try {paths}\n")
            )
            return
        response = http.Response.make(reply.status, reply.body, reply.headers)
        response.headers["Cache-Control"] = "no-store"
        flow.response = answer_to(flow.request, response)
