"""Where `reshape report` gets its numbers: a Prometheus server's HTTP API, or the request log.

Both give, per arm of one experiment, the same `ArmData`; what a source cannot know is None.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reshape.base.errors import ReshapeError, UsageError
from reshape.report.stats import Histogram

PROMETHEUS_TIMEOUT = 10.0
# Prometheus' duration syntax: units largest first, each at most once, whole numbers (1w2d, 90m,
# 1h30m, 500ms); a year is 365 days. Also a number of seconds (1.5), as Prometheus 3 accepts.
_UNITS: tuple[tuple[str, float], ...] = (
    ("y", 365 * 86400),
    ("w", 7 * 86400),
    ("d", 86400),
    ("h", 3600),
    ("m", 60),
    ("s", 1),
    ("ms", 0.001),
)
_DURATION = re.compile("".join(rf"(?:(?P<{u}>\d+){u})?" for u, _ in _UNITS))
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


@dataclass
class ArmData:
    """One arm's raw material. Counts are requests unless said otherwise."""

    arm: str  # the arm's name, without the "<experiment>:" prefix
    requests: int = 0
    errors: int = 0  # outcome other than ok
    queued: int | None = None
    # Requests whose upstream connection kind is known, and how many of them opened a new one.
    connection_known: int | None = None
    new_connections: int | None = None
    bytes_total: float = 0.0
    bytes_values: list[float] | None = None  # per request (log only)
    latencies: list[float] | None = None  # sorted transaction seconds (log)
    histogram: Histogram | None = None  # transaction seconds (Prometheus)
    policies: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class ExperimentData:
    experiment: str
    source: str  # what it came from, for the report's heading
    arms: dict[str, ArmData]


def parse_duration(text: str) -> float:
    """A duration as Prometheus writes it ('30s', '1h30m', '1w', '500ms', '2y'), or a number of
    seconds → seconds."""
    text = text.strip()
    if _SECONDS.fullmatch(text):
        seconds = float(text)
    else:
        match = _DURATION.fullmatch(text)
        seconds = 0.0
        if text and match:
            seconds = sum(int(match[u] or 0) * factor for u, factor in _UNITS)
    if seconds <= 0:
        raise UsageError(
            f"--since: expected a duration as Prometheus writes it (30s, 15m, 1h30m, 1d, 1w, "
            f"500ms) or seconds, got {text!r}"
        )
    return seconds


def _arm_name(label: str, experiment: str) -> str | None:
    prefix = f"{experiment}:"
    return label[len(prefix) :] if label.startswith(prefix) else None


def _no_data(experiment: str, seen: Iterable[str], where: str) -> ReshapeError:
    names = sorted({arm.partition(":")[0] for arm in seen if ":" in arm})
    if not names:
        return ReshapeError(f"no experiment data in {where}")
    return UsageError(
        f"unknown experiment {experiment!r} in {where} (experiments seen: {', '.join(names)})"
    )


# the request log


def _log_records(path: Path, unreadable: list[int]) -> Iterator[dict[str, Any]]:
    """The records of the log; the lines that are none are counted in `unreadable[0]`, but for
    a last line cut short (the proxy was killed mid-write), which is skipped silently."""
    try:
        handle = path.open(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read --log {path}: {e.strerror or e}") from None
    with handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if line.endswith("\n"):
                    unreadable[0] += 1
                continue
            if isinstance(record, dict):
                yield record
            else:
                unreadable[0] += 1


def _measure(value: object) -> float | None:
    """A latency or a size as a record has it: a finite number, not negative; else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def _epoch(rfc3339: object) -> float | None:
    if not isinstance(rfc3339, str):
        return None
    import datetime

    try:
        return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def load_log(path: Path, experiment: str, since: float | None) -> ExperimentData:
    """Per-arm data from a request log (reshape/features/request_log/addon.py)."""
    earliest = time.time() - since if since is not None else None
    arms: dict[str, ArmData] = {}
    seen: set[str] = set()
    unreadable = [0]
    bad_values = 0  # records of the experiment with a latency or size that is no measure
    for record in _log_records(path, unreadable):
        label = record.get("arm")
        if not isinstance(label, str):
            continue
        seen.add(label)
        name = _arm_name(label, experiment)
        if name is None:
            continue
        if earliest is not None:
            moment = _epoch(record.get("time"))
            if moment is None or moment < earliest:
                continue
        data = arms.setdefault(name, ArmData(name, bytes_values=[], latencies=[]))
        assert data.bytes_values is not None and data.latencies is not None
        data.requests += 1
        policy = record.get("policy")
        if isinstance(policy, str):
            data.policies.add(policy)
        if record.get("outcome") != "ok":
            data.errors += 1
        queued = record.get("queued")
        if isinstance(queued, bool):
            data.queued = (data.queued or 0) + queued
        kind = record.get("upstream_connection")
        if isinstance(kind, str):
            data.connection_known = (data.connection_known or 0) + 1
            data.new_connections = (data.new_connections or 0) + (kind == "new")
        size, latency = _measure(record.get("bytes")), _measure(record.get("transaction_seconds"))
        if size is not None:
            data.bytes_total += size
            data.bytes_values.append(size)
        if latency is not None:
            data.latencies.append(latency)
        bad_values += (size is None and record.get("bytes") is not None) or (
            latency is None and record.get("transaction_seconds") is not None
        )
    if not arms:
        window = f" (last {since:g} s)" if since is not None else ""
        if any(_arm_name(label, experiment) for label in seen):
            raise ReshapeError(f"no requests of experiment {experiment!r} in {path}{window}")
        if not seen and unreadable[0]:
            raise ReshapeError(
                f"no experiment data in {path}: none of its {unreadable[0]} lines is a request "
                "record (one JSON object a line, as --request-log writes them; a compressed "
                "log must be decompressed first)"
            )
        raise _no_data(experiment, seen, str(path))
    for data in arms.values():
        assert data.latencies is not None
        data.latencies.sort()
        if data.queued is not None and data.requests:
            data.queued = min(data.queued, data.requests)
    skipped = [
        f"{unreadable[0]} lines that are no request record" if unreadable[0] else "",
        f"{bad_values} records' negative or non-finite latencies or sizes" if bad_values else "",
    ]
    note = "; ".join(filter(None, skipped))
    source = f"request log {path}" + (f" (skipped: {note})" if note else "")
    return ExperimentData(experiment, source, dict(sorted(arms.items())))


# Prometheus


class PrometheusClient:
    """The instant-query endpoint of Prometheus' HTTP API, over urllib.

    Credentials: `user:password@` in the URL (sent as Basic authentication), a bearer token, or
    any headers (`Authorization: …`, a tenant header). None of them is ever printed: messages name
    the server by `url`, which has the credentials taken out."""

    def __init__(
        self,
        url: str,
        timeout: float = PROMETHEUS_TIMEOUT,
        *,
        bearer_token: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UsageError(f"--prometheus: expected an http(s) URL, got {redact(url)!r}")
        self.headers = dict(headers or {})
        if parsed.username is not None or parsed.password is not None:
            user = urllib.parse.unquote(parsed.username or "")
            password = urllib.parse.unquote(parsed.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers.setdefault("Authorization", f"Basic {token}")
        if bearer_token is not None:
            self.headers["Authorization"] = f"Bearer {bearer_token}"
        self.url = redact(url).rstrip("/")
        self._address = self.url  # what is asked for: the URL without credentials
        self.timeout = timeout

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) for each series of an instant vector."""
        address = f"{self._address}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        request = urllib.request.Request(address, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                raise ReshapeError(
                    f"Prometheus at {self.url} refused the credentials (HTTP {e.code}): give them "
                    "in the URL (https://USER:PASSWORD@host), with --prometheus-token-file, or "
                    "with --prometheus-header"
                ) from None
            detail = _error_text(e)
            raise ReshapeError(f"Prometheus at {self.url} refused a query: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ReshapeError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ReshapeError(f"{self.url} did not answer like a Prometheus server") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ReshapeError(f"Prometheus at {self.url}: query failed: {body!r:.200}")
        result = body.get("data", {}).get("result", [])
        series = []
        for item in result:
            value = float(item["value"][1])
            if not math.isnan(value):
                series.append((dict(item["metric"]), value))
        return series


def redact(url: str) -> str:
    """`url` without its user name and password."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.username is None and parsed.password is None:
        return url
    host = parsed.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parsed._replace(netloc=host))


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(e).get("error", e))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, OSError):
        return f"HTTP {e.code}"


def _promql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def load_prometheus(
    client: PrometheusClient, experiment: str, since: float | None
) -> ExperimentData:
    """Per-arm data from reshape's metrics as a Prometheus server holds them.

    Without `since`: the counters' current values (everything since each proxy process started,
    summed over processes and instances). With it: `increase()` over the window."""
    selector = f'arm=~"{_promql_string(re.escape(experiment))}:.*"'

    def total(metric: str, extra: str = "", by: str = "arm") -> list[tuple[dict[str, str], float]]:
        series = f"{metric}{{{selector}{extra}}}"
        if since is not None:
            series = f"increase({series}[{math.ceil(since * 1000)}ms])"
        return client.query(f"sum by ({by}) ({series})")

    arms: dict[str, ArmData] = {}

    def arm(labels: dict[str, str]) -> ArmData | None:
        name = _arm_name(labels.get("arm", ""), experiment)
        return None if name is None else arms.setdefault(name, ArmData(name))

    for labels, value in total("reshape_requests_total", by="arm, policy, outcome"):
        data = arm(labels)
        if data is not None:
            data.requests += round(value)
            data.policies.add(labels.get("policy", ""))
            if labels.get("outcome") != "ok":
                data.errors += round(value)
    if not arms:
        seen = [
            labels.get("arm", "")
            for labels, _ in client.query("group by (arm) (reshape_requests_total)")
        ]
        raise _no_data(experiment, seen, f"Prometheus at {client.url}")
    for labels, value in total("reshape_requests_queued_total"):
        if (data := arm(labels)) is not None:
            data.queued = round(value)
    for metric in ("reshape_upstream_requests_total", "reshape_direct_requests_total"):
        for labels, value in total(metric, by="arm, connection"):
            if (data := arm(labels)) is not None:
                data.connection_known = (data.connection_known or 0) + round(value)
                if labels.get("connection") == "new":
                    data.new_connections = (data.new_connections or 0) + round(value)
    for labels, value in total("reshape_response_bytes_total"):
        if (data := arm(labels)) is not None:
            data.bytes_total = value
    buckets: dict[str, dict[float, float]] = {}
    for labels, value in total("reshape_transaction_seconds_bucket", by="arm, le"):
        if (data := arm(labels)) is not None:
            buckets.setdefault(data.arm, {})[float(labels["le"])] = value
    for name, by_bound in buckets.items():
        bounds = tuple(sorted(by_bound))
        arms[name].histogram = Histogram(bounds, tuple(by_bound[b] for b in bounds))
    if all(data.requests == 0 for data in arms.values()):
        window = f" in the last {since:g} s" if since is not None else ""
        raise ReshapeError(f"no requests of experiment {experiment!r}{window} in Prometheus")
    window = f", last {since:g} s" if since is not None else ""
    return ExperimentData(
        experiment, f"Prometheus {client.url}{window}", dict(sorted(arms.items()))
    )
