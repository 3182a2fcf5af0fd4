"""An origin's informational (1xx) responses through `reshape run`, over HTTP/2 and HTTP/1.1 to
the origin (a scripted HTTPS origin, tests/support/scripted_origins.py `EarlyHintsOrigin`) and
HTTP/2 from the client, which sees every 1xx: a few 103s pass; a flood of them is cut off at
the engine's bound (reshape/upstream/http1.py `MAX_INTERIM_RESPONSES`) with a 502 that names it,
the request is not sent again, and the origin's connection is left as its protocol allows: an
HTTP/2 one serves the next request, an HTTP/1.1 one is closed (nothing of it lingers) and the
next request gets a new one. Unbounded, 200,000 103s cost the proxy 4.1 s of CPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.pki import OriginPKI
from reshape.upstream.http1 import MAX_INTERIM_RESPONSES
from tests.support.clients import h2_get
from tests.support.reshape_process import RunningProxy, StartProxy
from tests.support.scripted_origins import EarlyHintsOrigin

HOST = "127.0.0.132"
FLOOD = 1_000
# One connection to the origin: a request after the flood shows what became of it.
POLICY = "version: 1\ndefault: p\npolicies:\n  p: {upstream: {max_connections_per_host: 1}}\n"
HINT = {b":status": b"103", b"link": EarlyHintsOrigin.LINK}


@pytest.fixture(params=["h2", "http/1.1"])
def origin(request: pytest.FixtureRequest, origin_pki: OriginPKI) -> Iterator[EarlyHintsOrigin]:
    with EarlyHintsOrigin(HOST, origin_pki.issue([HOST]), alpn=(request.param,)) as scripted:
        yield scripted


@pytest.fixture
def proxy(start_reshape: StartProxy, tmp_path: Path) -> RunningProxy:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return start_reshape(policy=path)


def test_a_few_103s_reach_the_client_and_a_flood_of_them_is_a_502(
    proxy: RunningProxy, origin: EarlyHintsOrigin
) -> None:
    few = h2_get(proxy, origin, "/page?hints=3", {})
    assert (few.status, few.body, few.informational) == (200, b"/page?hints=3", [HINT] * 3)

    flood = h2_get(proxy, origin, f"/flood?hints={FLOOD}", {})
    assert flood.status == 502, flood
    assert b"more than 100 informational (1xx) responses to one request" in flood.body
    # Those before the bound were passed on, as a proxy must; not one more.
    assert flood.informational == [HINT] * MAX_INTERIM_RESPONSES

    after = h2_get(proxy, origin, "/after", {})
    assert (after.status, after.body, after.informational) == (200, b"/after", [HINT])
    # HTTP/2: the flood's stream alone was reset, its connection serves on. HTTP/1.1: the
    # connection could not be, and was closed; the next request had a new one.
    connection_after = 1 if origin.alpn == ("h2",) else 2
    assert origin.requests == [
        (1, "/page?hints=3"),
        (1, f"/flood?hints={FLOOD}"),  # once: it was answered, if badly
        (connection_after, "/after"),
    ]
    deadline = time.monotonic() + 5
    while origin.open > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert origin.open == 1  # the HTTP/1.1 connection of the flood did not linger


@pytest.fixture
def impatient_proxy(start_reshape: StartProxy, tmp_path: Path) -> RunningProxy:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\ndefault: p\npolicies:\n  p: {upstream: {read_timeout: 1}}\n",
    )
    return start_reshape(policy=path)


def test_an_origin_that_says_it_is_at_work_is_not_silent(
    impatient_proxy: RunningProxy, origin: EarlyHintsOrigin
) -> None:
    """`read_timeout` is the time an origin may stay silent: a 1xx every 0.5 s for 2.5 s, and
    its final answer after, is not a 504 at 1 s (as 102 Processing exists to prevent). The
    bound on their number still ends an origin that never stops."""
    slow = h2_get(impatient_proxy, origin, "/slow?hints=5&every=0.5", {})
    assert (slow.status, slow.body, slow.informational) == (
        200,
        b"/slow?hints=5&every=0.5",
        [HINT] * 5,
    )
    silent = h2_get(impatient_proxy, origin, "/silent?hints=1&every=1.5", {})
    assert silent.status == 504, silent
