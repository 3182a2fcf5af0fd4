"""reshape/mitm/patches/early_hints.py at the level of one mitmproxy HttpStream: what its
wakeup does (the system tests in tests/system/features/early_hints/ drive it end to end)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mitmproxy import connection, http
from mitmproxy.proxy import context
from mitmproxy.proxy.commands import RequestWakeup
from mitmproxy.proxy.events import Wakeup
from mitmproxy.proxy.layers.http import HttpStream, ResponseHeaders, SendHttp
from mitmproxy.test import taddons, tflow

from reshape.mitm.engine_client import InterimResponse
from reshape.mitm.patches import Patches
from reshape.mitm.patches.early_hints import WAITING, SendEarlyHints, early_hints_response

LINKS = ["</app.css>; rel=preload; as=style"]


@pytest.fixture
def seen() -> list[tuple[http.HTTPFlow, int, bool]]:
    """What the patch's interim_seen heard: an origin's 1xx, its status, whether sent on."""
    return []


@pytest.fixture
def sent(seen: list[tuple[http.HTTPFlow, int, bool]]) -> Iterator[list[http.HTTPFlow]]:
    flows: list[http.HTTPFlow] = []
    with Patches([SendEarlyHints(lambda flow: LINKS, flows.append, lambda *x: seen.append(x))]):
        yield flows


def stream() -> HttpStream:
    """A stream of an HTTP/2 client whose request's requestheaders hook has run."""
    client = connection.Client(
        peername=("127.0.0.1", 40000), sockname=("127.0.0.1", 8080), timestamp_start=0
    )
    client.alpn = b"h2"
    with taddons.context() as tctx:
        ctx = context.Context(client, tctx.options)
    created = HttpStream(ctx, stream_id=1)
    created.flow = tflow.tflow(client_conn=client)
    return created


def waiting(created: HttpStream) -> RequestWakeup:
    wakeup = RequestWakeup(0.01)
    created.__dict__[WAITING] = (wakeup, LINKS)
    return wakeup


def test_its_wakeup_sends_the_103_to_the_client(sent: list[http.HTTPFlow]) -> None:
    created = stream()
    commands = list(created._handle_event(Wakeup(waiting(created))))
    assert len(commands) == 1 and isinstance(commands[0], SendHttp)
    assert commands[0].connection is created.context.client
    assert isinstance(commands[0].event, ResponseHeaders)
    assert commands[0].event.response.status_code == 103
    assert commands[0].event.response.headers["link"] == LINKS[0]
    assert sent == [created.flow]


@pytest.mark.parametrize("came_first", ["response", "error"])
def test_nothing_once_the_response_or_an_error_came_first(
    sent: list[http.HTTPFlow], came_first: str
) -> None:
    created = stream()
    if came_first == "response":
        created.flow.response = tflow.tresp()
    else:
        created.flow.error = tflow.terr()
    assert list(created._handle_event(Wakeup(waiting(created)))) == []
    assert sent == []


def test_a_wakeup_nobody_asked_for_is_dropped(sent: list[http.HTTPFlow]) -> None:
    created = stream()
    ours = waiting(created)
    # mitmproxy's own HttpStream would fail on it (it asks for no wakeups).
    assert list(created._handle_event(Wakeup(RequestWakeup(1.0)))) == []
    assert list(created._handle_event(Wakeup(ours))) != []  # its own wakeup still works
    assert sent == [created.flow]


# An origin's own 1xx (the engine's InterimResponse events).


def test_an_origins_103_goes_on_to_an_http2_client_and_is_counted_apart(
    sent: list[http.HTTPFlow], seen: list[tuple[http.HTTPFlow, int, bool]]
) -> None:
    created = stream()
    hints = early_hints_response(["</origin.css>; rel=preload; as=style"])
    commands = list(created._handle_event(InterimResponse(1, hints)))
    assert len(commands) == 1 and isinstance(commands[0], SendHttp)
    assert commands[0].connection is created.context.client
    assert isinstance(commands[0].event, ResponseHeaders)
    assert commands[0].event.response is hints
    assert sent == []  # reshape's own hints are counted apart from the origin's
    assert seen == [(created.flow, 103, True)]


@pytest.mark.parametrize("why", ["http/1.1 client", "response", "error"])
def test_an_origins_103_is_dropped_for_http1_or_once_answered(
    sent: list[http.HTTPFlow], seen: list[tuple[http.HTTPFlow, int, bool]], why: str
) -> None:
    created = stream()
    if why == "http/1.1 client":
        created.context.client.alpn = b"http/1.1"  # its server layer would take it as final
    elif why == "response":
        created.flow.response = tflow.tresp()
    else:
        created.flow.error = tflow.terr()
    hints = early_hints_response(["</origin.css>; rel=preload; as=style"])
    assert list(created._handle_event(InterimResponse(1, hints))) == []
    assert seen == [(created.flow, 103, False)]
