"""The request log: whole JSON lines, bounded writes, one record per completed request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy.test import tflow

from reshape.base.errors import UsageError
from reshape.base.flowstate import state_of
from reshape.features.request_log.addon import RequestLogFile, RequestRecords, record
from reshape.policy.chooser import PolicyChooser
from reshape.policy.loader import parse_policy_text

POLICY = parse_policy_text("version: 1\ndefault: a\npolicies: {a: {}}\n", Path("p.yaml"))


def test_lines_are_buffered_and_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    first, second = RequestLogFile(path), RequestLogFile(path)  # two workers, one file
    first.append({"n": 1})
    second.append({"n": 2})
    assert path.read_bytes() == b""  # buffered: nothing written yet
    first.flush()
    second.close()
    first.append({"n": 3})
    first.close()
    lines = path.read_text().splitlines()
    assert sorted(json.loads(line)["n"] for line in lines) == [1, 2, 3]


def test_an_unwritable_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot open --request-log .*No such file"):
        RequestLogFile(tmp_path / "absent" / "log.jsonl")


def test_record_fields_of_a_direct_request() -> None:
    flow = tflow.tflow(resp=True)
    records = RequestRecords(None)
    PolicyChooser(POLICY).requestheaders(flow)
    records.requestheaders(flow)
    flow.server_conn.timestamp_start = flow.request.timestamp_start
    assert records._direct_connection_kind(flow) == "new"
    assert records._direct_connection_kind(flow) == "reused"
    line = record(flow, "ok", pooled=False, kind="new")
    assert line["policy"] == "a" and line["arm"] == "none" and line["experiment"] is None
    assert line["status"] == 200 and line["outcome"] == "ok" and line["bytes"] == len(b"message")
    assert line["method"] == "GET" and line["host"] == "address"
    assert line["time"].endswith("Z") and line["queued"] is None
    json.dumps(line)


def test_reshapes_own_answer_has_no_transaction_time() -> None:
    """As `reshape_transaction_seconds` leaves them out: a refused destination's 403 took
    ~25 us of reshape's own, and `reshape report --log` counted it in the arm's latencies."""
    flow = tflow.tflow(resp=True)
    PolicyChooser(POLICY).requestheaders(flow)
    assert record(flow, "ok", pooled=False, kind="new")["transaction_seconds"] is not None
    state_of(flow).outcome = "rejected"
    assert record(flow, "rejected", pooled=False, kind=None)["transaction_seconds"] is None
