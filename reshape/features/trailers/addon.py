"""Applies the policy's `trailers:` section to each response, and surveys which clients take
trailers (the decisions are reshape/features/trailers/rules.py's).

Per response: when its head arrives the plan is made (`plan_for`). For an HTTP/1.1 client that
gets trailers, a body that is not chunked is switched to chunked framing if trailers may follow
(a synthesized digest, or an HTTP/2 origin response without a length or announcing a `Trailer`
field) — an HTTP/1.1 message has no other place for them. Under PROMOTE, a body that may end
with trailers and is small enough is held back whole (mitmproxy then sends the head only after
the `response` hook, where the fields are added to it); a synthesized digest is computed by a
`response.stream` callable wrapped around whatever was there (Telemetry's byte counter). When
the body has ended, `settle` decides what goes out, and the `response` hook sets
`flow.response.trailers` accordingly: mitmproxy sends trailers only after that hook.

mitmproxy itself streams a held body once it passes 1 MiB (`stream_large_bodies` in
reshape/app/runtime.py): such a body's trailers are stripped, whatever `max_promote_buffer` says.

Survey: the first request of each client connection (CONNECT aside) counts once in
`reshape_clients_total{accepts_trailers, client_family}`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mitmproxy import connection, http

from reshape.base.client_family import client_family
from reshape.base.flowstate import state_of
from reshape.features.telemetry import metrics
from reshape.features.telemetry.metrics import labelled
from reshape.features.trailers.rules import (
    ContentDigest,
    Delivery,
    TrailerPlan,
    client_takes_trailers,
    may_promote,
    plan_for,
    settle,
)
from reshape.policy.chooser import selection_of

StreamCallable = Callable[[bytes], bytes | Iterable[bytes]]


class DigestingStream:
    """A `response.stream` callable: the body passes through `inner` (another stream callable)
    unchanged, and what `inner` returns — the body as sent — is hashed."""

    __slots__ = ("digest", "inner")

    def __init__(self, inner: StreamCallable) -> None:
        self.inner = inner
        self.digest = ContentDigest()

    def __call__(self, chunk: bytes) -> bytes | Iterable[bytes]:
        out = self.inner(chunk)
        if isinstance(out, bytes):
            self.digest.update(out)
            return out
        pieces = list(out)
        for piece in pieces:
            self.digest.update(piece)
        return pieces


@dataclass
class FlowTrailers:
    """What the addon keeps about one response between its head and its end."""

    plan: TrailerPlan
    h1_client: bool
    has_body: bool


def _is_chunked(message: http.Message) -> bool:
    return "chunked" in message.headers.get("transfer-encoding", "").lower()


def _has_body(flow: http.HTTPFlow) -> bool:
    assert flow.response is not None
    status = flow.response.status_code
    return flow.request.method.upper() != "HEAD" and status >= 200 and status not in (204, 304)


def _may_end_with_trailers(response: http.Response) -> bool:
    """Whether the origin may still send trailers after this head: an HTTP/2 or HTTP/3 one, a
    chunked one, or one without a length. The engine's heads (reshape/mitm/engine_channel.py's
    `mitmproxy_response`) all say HTTP/1.1 and mark a body without a length chunked, except
    for an HTTP/1.0 client, which has no chunked coding: for it, no length is the only sign
    (an HTTP/1.0 origin's body read to the close has none either: under PROMOTE it is held for
    nothing, as a chunked body without trailers is)."""
    return (
        response.is_http2
        or response.is_http3
        or _is_chunked(response)
        or "content-length" not in response.headers
    )


def _content_length(response: http.Response) -> int | None:
    value = response.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


def _h1_client(flow: http.HTTPFlow) -> bool:
    return not (flow.request.is_http2 or flow.request.is_http3)


class Trailers:
    def __init__(self) -> None:
        self._surveyed: set[str] = set()  # ids of client connections already counted

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        client = flow.client_conn
        if flow.request.method == "CONNECT" or client.id in self._surveyed:
            return
        self._surveyed.add(client.id)
        takes = client_takes_trailers(flow.request.http_version, flow.request.headers.get("te", ""))
        family = client_family(flow.request.headers.get("user-agent", ""))
        labelled(metrics.clients_total, "yes" if takes else "no", family).inc()

    def client_disconnected(self, client: connection.Client) -> None:
        self._surveyed.discard(client.id)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        knobs = selection_of(flow).policy.trailers
        plan = plan_for(knobs, flow.request.http_version, flow.request.headers.get("te", ""))
        state = FlowTrailers(plan, _h1_client(flow), _has_body(flow))
        state_of(flow).trailers = state
        if not state.has_body:
            return
        if plan.delivery is Delivery.FORWARD and state.h1_client and not _is_chunked(response):
            origin_may_add = (response.is_http2 or response.is_http3) and (
                "content-length" not in response.headers or "trailer" in response.headers
            )
            if plan.synthesize_digest or origin_may_add:
                response.headers.pop("content-length", None)
                response.headers["transfer-encoding"] = "chunked"
        elif (
            plan.delivery is Delivery.PROMOTE
            and _may_end_with_trailers(response)
            and may_promote(knobs, _content_length(response))
        ):
            response.stream = False  # hold the body: its head waits for the trailers
        if plan.synthesize_digest and callable(response.stream):
            response.stream = DigestingStream(response.stream)

    def response(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow).trailers
        response = flow.response
        if state is None or response is None:
            return
        received = list(response.trailers.items(multi=True)) if response.trailers else []
        held = not response.stream and response.raw_content is not None
        digest = None
        if state.plan.synthesize_digest and state.has_body:
            if isinstance(response.stream, DigestingStream):
                digest = response.stream.digest.value()
            elif held:
                digest = ContentDigest([response.raw_content or b""]).value()
        if not received and digest is None:
            return
        can_carry = not state.h1_client or (state.has_body and _is_chunked(response))
        selection = selection_of(flow)
        outcome = settle(
            state.plan,
            selection.policy.trailers,
            received,
            digest=digest,
            can_carry=can_carry,
            held_bytes=len(response.raw_content or b"") if held else None,
        )
        # HTTP/2 and HTTP/3 field names are lower case (RFC 9113 §8.2.1); mitmproxy 12.2.3 sends
        # trailers as given, and a client rejects the whole stream over an upper-case name.
        fields = (
            outcome.trailers
            if state.h1_client
            else tuple((n.lower(), v) for n, v in outcome.trailers)
        )
        response.trailers = (
            http.Headers([(_encode(n), _encode(v)) for n, v in fields]) if fields else None
        )
        for name, value in outcome.promoted:
            response.headers.add(name, value)
        for action in outcome.actions:
            labelled(metrics.trailers_total, selection.policy_name, selection.arm, action).inc()


def _encode(text: str) -> bytes:
    # As mitmproxy's Headers decode field bytes: utf-8 with surrogateescape, so bytes round-trip.
    return text.encode("utf-8", "surrogateescape")
