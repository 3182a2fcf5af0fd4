"""Early hints: a 103 for a page's document request, naming what earlier loads of it needed.

Thin on purpose: it tells the page-load tracker about requests, confirms a possible preload by
its response's head (`responseheaders`: the body is never needed), learns finished loads into
the table (reshape/features/early_hints/learning.py), and puts the Link values for a document
request on the flow's state; the patch `SendEarlyHints` writes them to the client as a 103 right
after this hook, before the request goes anywhere. It also counts the 1xx origins send
themselves, which the patch forwards to HTTP/2 clients whatever the knobs
(`reshape_origin_interim_responses_total`).

Only requests under a policy with `early_hints.mode: learned` take part; a load is learned with
the `max_misses` of the policy its document request ran under, and hinted by the knobs of the
policy the next one runs under. After Destinations and Onboarding: a request they answered
themselves (a refusal, the onboarding page) is neither learned nor hinted. Replayed flows are
left alone.

What is learned from one client is hinted to every client of the process, as the preconnect
feature's table is (see policies/README.md for what that means). With `--workers N` each worker
learns from the loads it sees; a browser's requests spread over the workers, so each learns
more slowly.
"""

from __future__ import annotations

import time

from mitmproxy import http

from reshape.base.flowstate import KEY, FlowState, state_of
from reshape.features.early_hints.learning import HintTable, PageLoads, fits
from reshape.features.preconnect.addon import is_navigation, origin_of, referer_origin
from reshape.features.telemetry import metrics
from reshape.policy.chooser import selection_of

# A page load collects its client's requests for at most this long.
LOAD_WINDOW = 20.0


class EarlyHints:
    def __init__(self) -> None:
        self.loads = PageLoads(window=LOAD_WINDOW)
        self.table = HintTable()

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.method == "CONNECT" or flow.is_replay:
            return
        knobs = selection_of(flow).policy.early_hints
        if knobs.mode == "off":
            return
        request = flow.request
        origin = origin_of(request.scheme, request.host, request.port)
        state = state_of(flow)
        peer = flow.client_conn.peername[0] if flow.client_conn.peername else "?"
        client = peer if state.proxy_user is None else f"{peer} {state.proxy_user}"
        now = time.monotonic()
        if not is_navigation(request):
            state.hint_candidate = self.loads.subresource(
                client,
                origin=origin,
                path=request.path,
                method=request.method,
                dest=request.headers.get("sec-fetch-dest"),
                referer=request.headers.get("referer"),
                referer_origin=referer_origin(request),
                now=now,
            )
            return
        url = request.url
        for finished in self.loads.document(client, url, origin, now, max_misses=knobs.max_misses):
            self.table.learn(finished)
        if request.method != "GET":
            return
        links = self.table.links(
            url,
            min_loads=knobs.min_loads,
            max_preloads=knobs.max_preloads,
            max_preconnects=knobs.max_preconnects,
            verify_every=knobs.verify_every,
        )
        if links:
            state.early_hints = links
            self.loads.hinted(client, links)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state: FlowState | None = flow.metadata.get(KEY)
        if state is None or state.hint_candidate is None or flow.response is None:
            return
        candidate, state.hint_candidate = state.hint_candidate, None
        headers = flow.response.headers
        if fits(
            candidate.dest,
            flow.response.status_code,
            headers.get("content-type"),
            headers.get("cache-control"),
            "set-cookie" in headers,
        ):
            PageLoads.confirm(candidate)

    # for SendEarlyHints (inside mitmproxy's protocol code: must not raise)

    def links_for(self, flow: http.HTTPFlow) -> list[str] | None:
        """The Link values to send `flow`'s client in a 103, if any."""
        state: FlowState | None = flow.metadata.get(KEY)
        return None if state is None else state.early_hints

    def hints_sent(self, flow: http.HTTPFlow) -> None:
        selection = state_of(flow).selection
        if selection is not None:
            metrics.early_hints_total.labels(selection.policy_name, selection.arm).inc()

    def interim_seen(self, flow: http.HTTPFlow, status: int, forwarded: bool) -> None:
        """An origin's 1xx for `flow`, sent on to the client or not."""
        selection = state_of(flow).selection
        if selection is not None:
            label = str(status) if str(status) in metrics.INTERIM_STATUSES else "other"
            metrics.origin_interim_responses_total.labels(
                selection.policy_name,
                selection.arm,
                label,
                "forwarded" if forwarded else "dropped",
            ).inc()
