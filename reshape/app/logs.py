"""The process log: level and format (`--log-level`, `--log-format text|json`), on stderr.

Text is for a terminal; JSON is one object per line for a log pipeline (journald, Docker, Loki,
Elasticsearch): `time` (RFC 3339, UTC), `level`, `logger`, `message`, `process`, the exception's
traceback as `exception` when there is one, and whatever a caller passed as `extra={"fields":
{...}}` (the request log's record, with `--log-requests`) merged in. The JSON formatter is a few
lines over the standard library's `json`: a library for it would be one more dependency on every
gateway for no gain.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, Literal

from reshape.base.log_fields import FIELDS

LogFormat = Literal["text", "json"]
LEVELS = ("debug", "info", "warning", "error")
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# mitmproxy logs every client connect and disconnect at INFO; reshape logs start-up facts,
# errors, and with --log-requests one line per request.
_QUIET_LOGGERS = ("mitmproxy.proxy.server", "mitmproxy.proxy.mode_servers")
# Tornado (the admin endpoint) logs malformed requests at INFO; they are the client's problem.
_WARNING_ONLY = ("tornado.general", "tornado.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        document: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            document.update({k: v for k, v in fields.items() if k not in document})
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str, ensure_ascii=False)


def setup_logging(level: str = "info", log_format: LogFormat = "text") -> None:
    """Log records at `level` and above to stderr, as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    # At debug, everything; otherwise these only from warnings up.
    noisy = logging.NOTSET if root.level <= logging.DEBUG else max(logging.WARNING, root.level)
    for name in (*_QUIET_LOGGERS, *_WARNING_ONLY):
        logging.getLogger(name).setLevel(noisy)
