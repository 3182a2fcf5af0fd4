"""One record per completed request: the JSON-lines request log and the per-arm connection counts.

`reshape run --request-log FILE` appends one JSON object per request that ended (answered, failed
or abandoned by its client) — what `reshape report --log FILE` reads when there is no Prometheus.
Fields:

| field | meaning |
| --- | --- |
| `time` | when the request began, RFC 3339 UTC |
| `policy`, `arm`, `experiment` | the selection; `arm` is `<experiment>:<arm>` or `none` |
| `client_proto` | `h1` or `h2` |
| `method`, `scheme`, `host` | as the client asked (before the upstream pool re-addresses it) |
| `status` | response status, null if none |
| `outcome` | `ok`, `upstream_error`, `client_aborted`, `client_error`, `rejected` |
| `transaction_seconds` | request ready → the origin's first byte (null for reshape's own answers) |
| `pooled` | whether the shared upstream pool carried it |
| `upstream_connection` | `new`, `reused`, `multiplexed`; pooled also `pipelined`, `preconnected` |
| `queued` | pooled: whether it waited for a connection; null for mitmproxy's connections |
| `queue_seconds` | pooled: ready → connection assigned (`reshape_request_queue_seconds`) |
| `bytes` | response body bytes relayed to the client |
| `error` | mitmproxy's error text, null if none |

For requests the shared pool carries, the engine's assignment is on the flow's state (set by the
join, reshape/mitm/engine_channel.py); a pooled request that got no response (503, 502) has
null there.

Writing costs little and is bounded: records are kept in memory and written at most once a second
(or when 64 KB are waiting), each time with one `write()` of whole lines to a file opened with
O_APPEND. With `--workers N` every worker appends to the same file: on Linux a write to a local
regular file opened with O_APPEND lands whole at the end, so lines of different workers never
interleave (not guaranteed on NFS). Should a write fail (disk full), the records are dropped and
the log says so once.

Rotation (logrotate, or any tool that moves the file away): the file is opened again, by name, on
SIGUSR1 (with `--workers N`, the supervisor passes it on to every worker), and before each write
when the name no longer leads to the file being written (moved or removed): lines written before
that are in the moved file, lines after it in the new one, none lost. A rotation tool that
compresses the moved file must wait one cycle (logrotate's `delaycompress`, as
deploy/logrotate/reshape does). With `copytruncate` nothing needs reopening (O_APPEND writes at
the new end), but lines written between the copy and the truncation are lost: prefer the default
`create`.

`--log-requests` also logs each record to the process log (reshape/app/logs.py) at info, one
line per request; with `--log-format json` the record is the line's `request` field.

The same record also counts `reshape_direct_requests_total{policy,arm,connection}`, the
connections mitmproxy's own origin connections contribute per arm.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from mitmproxy import connection, http

from reshape.base.errors import UsageError
from reshape.base.flowstate import state_of
from reshape.base.log_fields import FIELDS
from reshape.features.telemetry import metrics
from reshape.features.telemetry.addon import client_proto, error_outcome
from reshape.features.telemetry.metrics import labelled
from reshape.policy.chooser import selection_of
from reshape.policy.selection import NO_ARM
from reshape.upstream.types import Assignment

log = logging.getLogger("reshape.request_log")
# --log-requests: one line per completed request in the process log.
requests_log = logging.getLogger("reshape.requests")

FLUSH_SECONDS = 1.0
FLUSH_BYTES = 64 * 1024


class RequestLogFile:
    """Appends whole JSON lines, buffered, one `write()` per flush; reopens the file by name when
    asked (SIGUSR1) or when the name leads elsewhere (rotated)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd, self._identity = self._open()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._last_flush = time.monotonic()
        self._failed = False

    def _open(self) -> tuple[int, tuple[int, int]]:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise UsageError(f"cannot open --request-log {self.path}: {e.strerror or e}") from None
        st = os.fstat(fd)
        return fd, (st.st_dev, st.st_ino)

    def reopen(self) -> None:
        """Open the file by its name again; what waits is written there at the next flush."""
        try:
            fd, identity = self._open()
        except UsageError as e:
            log.error("request log: %s; still writing to the file open before", e)
            return
        os.close(self._fd)
        self._fd, self._identity = fd, identity

    def _moved(self) -> bool:
        """Whether the name no longer leads to the file being written (rotated or removed)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._identity

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        self._pending.append(line)
        self._pending_bytes += len(line)
        if (
            self._pending_bytes >= FLUSH_BYTES
            or time.monotonic() - self._last_flush >= FLUSH_SECONDS
        ):
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        if self._moved():
            self.reopen()
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        try:
            written = os.write(self._fd, data)
            if written != len(data):  # a regular file writes short only when the disk is full
                raise OSError(f"short write ({written} of {len(data)} bytes)")
        except OSError as e:
            if not self._failed:
                log.error("request log %s: write failed, records dropped: %s", self.path, e)
            self._failed = True
            return
        if self._failed:
            log.info("request log %s: writing again", self.path)
            self._failed = False

    def close(self) -> None:
        self.flush()
        os.close(self._fd)


def rfc3339(timestamp: float) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RequestRecords:
    """Builds each completed request's record; writes it to the log file, if there is one."""

    def __init__(self, path: Path | None, log_requests: bool = False) -> None:
        self.file = RequestLogFile(path) if path is not None else None
        self.log_requests = log_requests
        self._flusher: asyncio.Task[None] | None = None
        # mitmproxy's own origin connections: requests each has carried so far.
        self._served: dict[str, int] = {}

    def running(self) -> None:
        if self.file is not None:
            loop = asyncio.get_running_loop()
            self._flusher = loop.create_task(self._flush_forever())
            loop.add_signal_handler(signal.SIGUSR1, self.reopen)

    def reopen(self) -> None:
        if self.file is not None:
            self.file.reopen()
            log.info("request log %s reopened", self.file.path)

    async def _flush_forever(self) -> None:
        assert self.file is not None
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            self.file.flush()

    def done(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(RuntimeError):  # the loop may be closing already
                asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
        if self.file is not None:
            self.file.close()
            self.file = None

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        state_of(flow).asked = (request.method, request.scheme, request.pretty_host)

    def server_disconnected(self, data: Any) -> None:
        server: connection.Server = data.server
        self._served.pop(server.id, None)

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow, state_of(flow).outcome or "ok")

    def error(self, flow: http.HTTPFlow) -> None:
        self._finish(flow, error_outcome(flow))

    def _finish(self, flow: http.HTTPFlow, outcome: str) -> None:
        state = state_of(flow)
        if state.logged or state.asked is None:
            return  # a response after an error, or a flow that never began here
        state.logged = True
        selection = selection_of(flow)
        pooled = state.pooled
        assignment = state.assignment if pooled else None
        kind = assignment.kind if assignment else None
        if not pooled:
            kind = self._direct_connection_kind(flow)
        if kind is not None and not pooled:
            labelled(
                metrics.direct_requests_total, selection.policy_name, selection.arm, kind
            ).inc()
        if self.file is None and not self.log_requests:
            return
        line = record(flow, outcome, pooled, kind, assignment)
        if self.file is not None:
            self.file.append(line)
        if self.log_requests:
            requests_log.info("%s", describe(line), extra={FIELDS: {"request": line}})

    def _direct_connection_kind(self, flow: http.HTTPFlow) -> str | None:
        server = flow.server_conn
        if server.timestamp_start is None or flow.response is None:
            return None  # never reached an origin
        carried = self._served.get(server.id, 0)
        self._served[server.id] = carried + 1
        if carried == 0:
            return "new"
        return "multiplexed" if server.alpn == b"h2" else "reused"


def describe(line: dict[str, Any]) -> str:
    """A request's record as one readable line of the process log."""
    seconds = line["transaction_seconds"]
    took = f"{seconds * 1000:.1f} ms" if seconds is not None else "-"
    status = line["status"] if line["status"] is not None else "-"
    return (
        f"{line['method']} {line['scheme']}://{line['host']} {status} {line['outcome']} {took} "
        f"{line['bytes']} B policy={line['policy']} arm={line['arm']}"
        + (f" error={line['error']!r}" if line["error"] else "")
    )


def record(
    flow: http.HTTPFlow,
    outcome: str,
    pooled: bool,
    kind: str | None,
    assignment: Assignment | None = None,
) -> dict[str, Any]:
    """The log line of a completed request (see the module docstring for the fields)."""
    selection = selection_of(flow)
    request, response = flow.request, flow.response
    state = state_of(flow)
    method, scheme, host = state.asked or (request.method, request.scheme, request.pretty_host)
    transaction = None
    # As the metric has it: only the origin's responses (reshape's own 403, 502, 503, 504,
    # whose outcome it set, would count its own microseconds as the origin's wait).
    if (
        response is not None
        and request.timestamp_end
        and response.timestamp_start
        and not state.outcome
    ):
        transaction = round(max(0.0, response.timestamp_start - request.timestamp_end), 6)
    counter = state.byte_counter
    if counter is not None:
        body_bytes = counter.count
    elif response is not None:
        body_bytes = len(response.raw_content or b"")
    else:
        body_bytes = 0
    return {
        "time": rfc3339(request.timestamp_start),
        "policy": selection.policy_name,
        "arm": selection.arm,
        "experiment": None if selection.arm == NO_ARM else selection.arm.partition(":")[0],
        "client_proto": client_proto(flow),
        "method": method,
        "scheme": scheme,
        "host": host,
        "status": response.status_code if response is not None else None,
        "outcome": outcome,
        "transaction_seconds": transaction,
        "pooled": pooled,
        "upstream_connection": kind,
        "queued": assignment.queued if assignment else None,
        "queue_seconds": round(assignment.queue_seconds, 6) if assignment else None,
        "bytes": body_bytes,
        "error": str(flow.error) if flow.error else None,
    }
