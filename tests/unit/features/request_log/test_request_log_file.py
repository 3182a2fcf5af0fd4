"""RequestLogFile across rotations: moved, removed, reopened on request — no line lost."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from mitmproxy.test import tflow

from reshape.app.logs import FIELDS
from reshape.features.request_log.addon import RequestLogFile, RequestRecords, describe, record
from reshape.policy.chooser import PolicyChooser
from reshape.policy.loader import parse_policy_text

POLICY = parse_policy_text("version: 1\ndefault: a\npolicies: {a: {}}\n", Path("p.yaml"))


def numbers(*paths: Path) -> list[int]:
    return sorted(json.loads(line)["n"] for p in paths for line in p.read_text().splitlines())


def test_a_moved_file_is_noticed_and_the_name_opened_again(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLogFile(path)
    log.append({"n": 1})
    log.flush()
    path.rename(tmp_path / "requests.jsonl.1")  # what logrotate's default (create) does
    path.touch()
    log.append({"n": 2})
    log.flush()
    log.append({"n": 3})
    log.close()
    assert numbers(tmp_path / "requests.jsonl.1") == [1]
    assert numbers(path) == [2, 3]


def test_a_removed_file_is_created_again(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLogFile(path)
    log.append({"n": 1})
    log.flush()
    path.unlink()
    log.append({"n": 2})
    log.close()
    assert numbers(path) == [2]


def test_reopen_on_request_writes_what_waits_to_the_new_file(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLogFile(path)
    log.append({"n": 1})
    path.rename(tmp_path / "old.jsonl")
    log.reopen()  # SIGUSR1 after the move, before the pending line was written
    log.close()
    assert numbers(path) == [1] and numbers(tmp_path / "old.jsonl") == []


def test_an_unopenable_name_keeps_the_old_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "requests.jsonl"
    log = RequestLogFile(path)
    path.rename(tmp_path / "moved.jsonl")
    directory.rmdir()  # the name cannot be created any more
    log.append({"n": 1})
    log.flush()
    log.close()
    assert numbers(tmp_path / "moved.jsonl") == [1]
    assert "still writing to the file open before" in caplog.text


def test_log_requests_puts_each_record_in_the_process_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flow = tflow.tflow(resp=True)
    PolicyChooser(POLICY).requestheaders(flow)
    records = RequestRecords(None, log_requests=True)
    records.requestheaders(flow)
    with caplog.at_level(logging.INFO, logger="reshape.requests"):
        records.response(flow)
    (logged,) = caplog.records
    line = getattr(logged, FIELDS)["request"]
    assert line["status"] == 200 and line["policy"] == "a"
    assert logged.getMessage() == describe(line)
    assert logged.getMessage().startswith("GET http://address 200 ok ")
    assert "policy=a arm=none" in logged.getMessage()


def test_without_log_requests_nothing_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    flow = tflow.tflow(resp=True)
    PolicyChooser(POLICY).requestheaders(flow)
    records = RequestRecords(None)
    records.requestheaders(flow)
    with caplog.at_level(logging.DEBUG):
        records.response(flow)
    assert not caplog.records


def test_describe_a_failed_request() -> None:
    flow = tflow.tflow(err=True)
    PolicyChooser(POLICY).requestheaders(flow)
    line = record(flow, "upstream_error", pooled=False, kind=None)
    assert describe(line).endswith("error='error'")
    assert " - upstream_error - " in describe(line)
