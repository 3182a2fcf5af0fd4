"""reshape/features/tls_records/addon.py on flows: which sizing a client connection takes, and
when. The records on the wire through reshape: tests/system/features/tls_records/test_addon.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from mitmproxy import connection, http
from mitmproxy.proxy import server_hooks
from mitmproxy.test import tflow

from reshape.features.tls_records.addon import TlsRecords
from reshape.policy.chooser import PolicyChooser
from reshape.policy.loader import parse_policy_text

UNIT_POLICY = """
version: 1
default: plain
policies:
  plain: {}
  off: {tls_records: {mode: "off"}}
  small: {tls_records: {small_bytes: 1000, warmup_bytes: 3000}}
  both: {tls_records: {small_bytes: 1000, warmup_bytes: 3000, side: both}}
rules:
  - {match: {destination: "off.example"}, policy: "off"}
  - {match: {destination: "small.example"}, policy: small}
  - {match: {destination: "both.example"}, policy: both}
"""


def request_on(client: connection.Client, host: str, method: str = "GET") -> http.HTTPFlow:
    """A flow on `client` whose policy PolicyChooser picked, as in the proxy."""
    flow = tflow.tflow()
    flow.client_conn = client
    flow.request.method = method
    flow.request.host = host
    PolicyChooser(parse_policy_text(UNIT_POLICY, Path("unit.yaml"))).requestheaders(flow)
    return flow


def test_a_connection_takes_the_sizing_of_its_first_request_over_tls() -> None:
    addon = TlsRecords(clock=lambda: 0.0)
    client = tflow.tclient_conn()
    client.tls = False
    addon.requestheaders(request_on(client, "small.example", "CONNECT"))  # TLS not started
    client.tls = True
    assert addon.record_sizes(client, client, 2500) is None
    addon.requestheaders(request_on(client, "small.example"))
    addon.requestheaders(request_on(client, "plain.example"))  # later requests change nothing
    assert addon.record_sizes(client, client, 2500) == [1000, 1000, 500]
    assert addon.record_sizes(client, client, 20_000) == [1000, 16_384, 2616]
    # side: client leaves the origin connections alone.
    assert addon.record_sizes(tflow.tserver_conn(), client, 2500) is None
    addon.client_disconnected(client)
    assert addon.record_sizes(client, client, 2500) is None


@pytest.mark.parametrize("first", ["plain.example", "off.example"])
def test_a_connection_whose_first_request_is_unsized_stays_unsized(first: str) -> None:
    addon = TlsRecords(clock=lambda: 0.0)
    client = tflow.tclient_conn()
    client.tls = True
    addon.requestheaders(request_on(client, first))
    addon.requestheaders(request_on(client, "small.example"))
    assert addon.record_sizes(client, client, 2500) is None


def test_plain_http_clients_are_never_sized() -> None:
    addon = TlsRecords(clock=lambda: 0.0)
    client = tflow.tclient_conn()
    client.tls = False
    addon.requestheaders(request_on(client, "small.example"))
    assert addon.record_sizes(client, client, 2500) is None


def test_side_both_warms_each_origin_connection_up_on_its_own() -> None:
    addon = TlsRecords(clock=lambda: 0.0)
    client = tflow.tclient_conn()
    client.tls = True
    addon.requestheaders(request_on(client, "both.example"))
    first, second = tflow.tserver_conn(), tflow.tserver_conn()
    assert addon.record_sizes(first, client, 3000) == [1000, 1000, 1000]
    assert addon.record_sizes(first, client, 3000) == [3000]
    assert addon.record_sizes(second, client, 3000) == [1000, 1000, 1000]
    assert addon.record_sizes(client, client, 1500) == [1000, 500]
    addon.server_disconnected(server_hooks.ServerConnectionHookData(first, client))
    assert addon.record_sizes(first, client, 3000) == [1000, 1000, 1000]  # a new connection
