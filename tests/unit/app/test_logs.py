"""reshape/app/logs.py: levels, text and JSON lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import redirect_stderr

import pytest

from reshape.app.logs import FIELDS, JsonFormatter, setup_logging


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def emit(level: str, log_format: str) -> str:
    stream = io.StringIO()
    with redirect_stderr(stream):
        setup_logging(level, log_format)  # type: ignore[arg-type]
        logging.getLogger("reshape.test").debug("debug %d", 1)
        logging.getLogger("reshape.test").info("info %s", "two")
        logging.getLogger("mitmproxy.proxy.server").info("client connect")
        logging.getLogger("reshape.test").warning("careful", extra={FIELDS: {"request": {"a": 1}}})
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("reshape.test").exception("failed")
    return stream.getvalue()


def test_json_lines() -> None:
    lines = [json.loads(line) for line in emit("info", "json").splitlines() if line[0] == "{"]
    assert [(d["level"], d["message"]) for d in lines] == [
        ("info", "info two"),
        ("warning", "careful"),
        ("error", "failed"),
    ]
    assert lines[0]["logger"] == "reshape.test" and lines[0]["time"].endswith("Z")
    assert lines[1]["request"] == {"a": 1}
    assert "ValueError: boom" in lines[2]["exception"]


def test_text_and_levels() -> None:
    text = emit("warning", "text")
    assert "careful" in text and "info two" not in text and "debug 1" not in text
    assert " WARNING reshape.test: careful" in text
    assert "client connect" not in emit("info", "text")  # mitmproxy's per-connection chatter
    debug = emit("debug", "text")
    assert "debug 1" in debug and "client connect" in debug


def test_a_field_never_replaces_the_records_own() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    setattr(record, FIELDS, {"message": "forged", "extra": 2})
    document = json.loads(JsonFormatter().format(record))
    assert document["message"] == "hello" and document["extra"] == 2
