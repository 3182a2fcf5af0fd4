"""A pytest plugin: run mitmproxy's own test suite with reshape's patches installed.

mitmproxy's tests are not part of its wheel, so this runs against a checkout of mitmproxy at the
pinned release (`make mitmproxy-suite MITMPROXY_SRC=...`, see DEVELOPERS.md). Every patch a
reshape process installs is installed for the whole session, as `ProxyProcess` configures them,
but for these, whose differences are intended and were checked by hand (2026-11-23, mitmproxy
12.2.3's test/mitmproxy/proxy and test_http.py: 571 passed with the rest installed):

- the timers — the first-byte timeout and the HTTP/1 head guard (`GuardHttp1Heads`) arm
  `RequestWakeup` commands that mitmproxy's playbook tests do not expect ("modulo our own
  timers"; with the head guard installed, 136 tests fail, each on its timer), and the silent
  tunnel's timer (`OpenSilentTunnels`: with it installed, 13 tests of lazy CONNECT tunnels fail,
  each on the `RequestWakeup` after the 200, 2026-12-04);
- `FrameRequests`: an HTTP/1.1 request without a Host field is answered 400 as RFC 9112 §3.2
  requires; 12 of mitmproxy's tests send such requests for brevity and fail on the 400;
- the listener patches, which only change socket options.

The engine join is installed with a router that routes nothing, so mitmproxy's own connections
are what the tests see, passing through the patched `get_connection` and `open_connection`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reshape.mitm.patches import Patches
from reshape.mitm.patches.authority_parse_cache import CacheAuthorityParses
from reshape.mitm.patches.body_size_check import CheckBodySizesFromHeads
from reshape.mitm.patches.client_tls_contexts import ReuseClientTlsContexts
from reshape.mitm.patches.connection_teardown import FinishConnectionTeardown
from reshape.mitm.patches.context_fork import ForkContextsWithoutAServer
from reshape.mitm.patches.early_hints import SendEarlyHints
from reshape.mitm.patches.engine_join import JoinEngine
from reshape.mitm.patches.h2_client_hpack import ClientHpackCoders
from reshape.mitm.patches.h2_frame_trace import ReceiveFramesUntraced
from reshape.mitm.patches.h2_header_validation import ValidateH2HeadersInOnePass
from reshape.mitm.patches.h2_held_output import HoldHttp2Output
from reshape.mitm.patches.http1_trailers import CarryHttp1Trailers
from reshape.mitm.patches.http2_flood_guard import GuardHttp2Floods
from reshape.mitm.patches.http2_frame_size import DefaultFrameSizeForClients
from reshape.mitm.patches.inline_hooks import InlineHooks
from reshape.mitm.patches.message_typecheck import SkipMessageTypecheck
from reshape.mitm.patches.option_reads import ReadOptionsWithoutCopies
from reshape.mitm.patches.origin_connect_timeout import OriginConnectTimeout
from reshape.mitm.patches.split_requests import ReportSplitRequests
from reshape.mitm.patches.tls_record_sizes import SizeTlsRecords
from reshape.mitm.patches.tunnel_passthrough import SendTunnelDataDirectly
from reshape.upstream.engine import Engine


def _ignore(*_: object) -> None:
    return None


@pytest.fixture(autouse=True, scope="session")
def reshape_patches() -> Iterator[None]:
    patches = Patches(
        [
            InlineHooks(),
            SkipMessageTypecheck(),
            ReadOptionsWithoutCopies(),
            CheckBodySizesFromHeads(),
            CacheAuthorityParses(),
            ReuseClientTlsContexts(),
            ForkContextsWithoutAServer(),
            ValidateH2HeadersInOnePass(),
            SizeTlsRecords(lambda conn, client, size: None),
            ReportSplitRequests(_ignore),
            SendEarlyHints(lambda flow: None, _ignore, _ignore),
            CarryHttp1Trailers(),
            SendTunnelDataDirectly(),
            GuardHttp2Floods(_ignore),
            DefaultFrameSizeForClients(),
            ClientHpackCoders(),
            ReceiveFramesUntraced(),
            FinishConnectionTeardown(),
            JoinEngine(Engine(None), lambda flow: None),
            HoldHttp2Output(),
            OriginConnectTimeout(10.0),
        ]
    )
    with patches:
        yield
