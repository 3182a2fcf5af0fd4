"""The Grafana dashboards in dashboards/: every panel's query answered by a real Prometheus
scraping a loaded reshape.

The test does what Grafana does with a panel: it resolves the template variables with their
own `label_values(...)` queries against Prometheus, substitutes them (and `$__rate_interval`,
`$__interval`, `$__range`) into each target's expression and runs it over the HTTP API — a range
query, or an instant one for table targets. Load comes from httpx (HTTP/2) through reshape to an
nginx origin over HTTPS, under policies that use the shared pool, TLS record sizing and trailers.
"""

from __future__ import annotations

import math
import re
import ssl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import reshape.features.telemetry.metrics  # noqa: F401  (registers every reshape metric)
from labkit.origins import Origin, nginx_origin
from labkit.pki import OriginPKI
from tests.support.prometheus import Prometheus
from tests.support.reshape_process import StartProxy
from tests.unit.test_dashboards import (
    DASHBOARDS,
    LABEL_VALUES,
    VARIABLE,
    Target,
    load,
    targets,
    variables,
)

# --------------------------------------------------------------------------------------- live

RATE_INTERVAL = "30s"  # what Grafana's $__rate_interval would be for a wide enough window
INTERVAL = "2s"
USERS = 24
REQUESTS_PER_USER = 6  # per user: 3 small pages, 1 large file, 1 POST, 1 more small page
BIG = 256 * 1024

# Three policies (all three kinds of measure), an experiment and a rule, so every label has values.
POLICY = """\
version: 1
default: pooled
policies:
  direct:
    tls_records: {mode: fixed, fixed_bytes: 4096, side: both}
  pooled:
    upstream: {max_connections_per_host: 6}
    tls_records: {mode: dynamic, small_bytes: 1400, warmup_bytes: 65536}
    trailers: {mode: auto, synthesize: [content-digest]}
  capped:
    upstream: {max_connections_per_host: 2, pipeline_depth: 4}
    tls_records: {mode: dynamic, small_bytes: 1400, warmup_bytes: 65536}
    trailers: {mode: promote}
rules:
  - match: {user_agent: "*direct-probe*"}
    policy: direct
experiments:
  - name: cap2-vs-cap6
    unit: header:X-User
    arms:
      control: {policy: pooled, weight: 50}
      treatment: {policy: capped, weight: 50}
"""


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def range(self) -> str:
        return f"{math.ceil(self.end - self.start)}s"


def format_value(variable: dict[str, Any], chosen: list[str] | None) -> str:
    """A variable's value as Grafana puts it into a Prometheus query: the All value, or the
    chosen values regex-escaped and joined as `(a|b)`; a single-value variable as it is."""
    if chosen is None:
        return str(variable["allValue"])
    if not variable.get("multi") and not variable.get("includeAll"):
        return chosen[0]
    return "(" + "|".join(re.sub(r"[$^*{}\[\]+?.()|\\]", r"\\\g<0>", v) for v in chosen) + ")"


def interpolate(expr: str, values: dict[str, str], window: Window) -> str:
    expr = (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__interval", INTERVAL)
        .replace("$__range", window.range)
    )
    return VARIABLE.sub(lambda m: values[m[1] or m[2]], expr)


def variable_values(
    prometheus: Prometheus, variable: dict[str, Any], values: dict[str, str], window: Window
) -> list[str]:
    """What Grafana offers for a `label_values(selector, label)` variable, its regex applied."""
    match = LABEL_VALUES.match(variable["definition"])
    assert match, variable["definition"]
    params: dict[str, str | list[str]] = {"start": str(window.start), "end": str(window.end)}
    if match[1]:
        params["match[]"] = [interpolate(match[1], values, window)]
    answer = prometheus.api(f"label/{match[2]}/values", **params)
    assert answer["status"] == "success", (variable["name"], answer)
    found = []
    pattern = variable.get("regex", "").strip("/")
    for value in answer["data"]:
        if pattern:
            hit = re.search(pattern, value)
            if not hit:
                continue
            value = hit[1] if hit.groups() else value
        if value not in found:
            found.append(value)
    return sorted(found)


def resolve(
    prometheus: Prometheus, path: Path, pick: dict[str, str], window: Window
) -> tuple[dict[str, str], list[str]]:
    """The dashboard's variables in order (a later query may use an earlier variable): each
    includeAll one set to All unless `pick` chooses a value, which must be on offer."""
    values: dict[str, str] = {}
    problems = []
    for name, variable in variables(load(path)).items():
        if variable["type"] == "datasource":
            continue
        offered = variable_values(prometheus, variable, values, window)
        if not offered:
            problems.append(f"{path.name}: variable ${name} offers nothing")
            values[name] = ".*"
            continue
        if name in pick:
            if pick[name] not in offered:
                problems.append(f"{path.name}: ${name} offers {offered}, not {pick[name]!r}")
            values[name] = format_value(variable, [pick[name]])
        elif variable.get("includeAll"):
            values[name] = format_value(variable, None)
        else:
            values[name] = format_value(variable, offered[:1])  # Grafana's default: the first
    return values, problems


def run_target(
    prometheus: Prometheus, target: Target, values: dict[str, str], window: Window
) -> tuple[str | None, bool]:
    """(problem or None, whether some sample is a number): errors and empty answers are problems."""
    expr = interpolate(target.expr, values, window)
    if target.instant:
        answer = prometheus.api("query", query=expr, time=str(window.end))
    else:
        answer = prometheus.api(
            "query_range",
            query=expr,
            start=str(window.start),
            end=str(window.end),
            step=INTERVAL.removesuffix("s"),
        )
    if answer.get("status") != "success":
        return f"{answer.get('errorType')}: {answer.get('error')} in {expr}", False
    series = answer["data"]["result"]
    if not series:
        return f"no series from {expr}", False
    samples = [s["value"] for s in series if "value" in s]
    samples += [v for s in series for v in s.get("values", [])]
    return None, any(math.isfinite(float(value)) for _, value in samples)


@pytest.fixture
def https_origin(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[Origin]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "page.html").write_text("<!doctype html><p>" + "x" * 3000)
    (root / "big.bin").write_bytes(bytes(range(256)) * (BIG // 256))
    # HTTP/1.1 only, so the pool queues and pipelines (an HTTP/2 origin would multiplex);
    # keepalive_requests: nginx ends connections now and then (mid-pipeline, too), as real
    # origins do, so retries and disabled pipelining have something to show.
    tls = origin_pki.issue(["127.0.0.2"])
    with nginx_origin(root, "127.0.0.2", tls=tls, keepalive_requests=25) as running:
        yield running


def browse(proxy_url: str, ca: Path, origin: Origin, user: int) -> list[int]:
    """One simulated user on one HTTP/2 client connection; a few users are routed by the rule."""
    agent = "direct-probe/1" if user % 6 == 5 else "reshape-dashboard-test/1"
    headers = {"X-User": f"user-{user}", "User-Agent": agent}
    statuses = []
    trust = ssl.create_default_context(cafile=str(ca))
    with httpx.Client(proxy=proxy_url, verify=trust, http2=True, timeout=30) as client:
        for path in ("/page.html", "/page.html", "/big.bin", "/page.html"):
            response = client.get(origin.url(path), headers=headers)
            assert len(response.content) == (BIG if path == "/big.bin" else 3018), path
            statuses.append(response.status_code)
        statuses.append(
            client.post(origin.url("/page.html"), content=b"a=1", headers=headers).status_code
        )
        statuses.append(client.get(origin.url("/page.html"), headers=headers).status_code)
    return statuses


@pytest.mark.slow
def test_every_panel_query_returns_data_from_a_real_prometheus(
    start_reshape: StartProxy, https_origin: Origin, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    proxy = start_reshape(policy=policy)
    prometheus = Prometheus(tmp_path, proxy.admin)
    try:
        # Counters must be scraped at 0 before the load: a series first seen at its final value
        # has no increase, and every rate() would be 0.
        deadline = time.monotonic() + 30
        while prometheus.value('count(reshape_requests_total{arm="cap2-vs-cap6:control"})') == 0:
            assert time.monotonic() < deadline, f"never scraped:\n{prometheus.log.read_text()}"
            time.sleep(0.2)
        start = time.time() - 5
        ca = proxy.ca_cert  # downloaded once, before threads could race to write it
        with ThreadPoolExecutor(6) as pool:
            statuses = [
                s
                for user_statuses in pool.map(
                    lambda user: browse(proxy.proxy_url, ca, https_origin, user),
                    range(USERS),
                )
                for s in user_statuses
            ]
        # nginx answers a POST to a static file 405; everything else must have arrived whole.
        assert sorted(set(statuses)) == [200, 405], statuses
        assert len(statuses) == USERS * REQUESTS_PER_USER
        deadline = time.monotonic() + 30
        while prometheus.value("sum(reshape_requests_total)") < len(statuses):
            assert time.monotonic() < deadline, "Prometheus never scraped all requests"
            time.sleep(0.5)
        time.sleep(2)  # one more scrape, so rate() has two points after the last request
        window = Window(start, time.time())

        problems = []
        # Pass 1, as a dashboard opens: every variable at All (or its first value); every
        # query answers, and with at least one number (NaN everywhere = a panel with no data).
        for path in DASHBOARDS:
            values, unresolved = resolve(prometheus, path, {}, window)
            problems += unresolved
            for target in targets(path):
                problem, has_number = run_target(prometheus, target, values, window)
                if problem is None and not has_number:
                    problem = "only NaN/Inf: the load never produced what this panel shows"
                if problem:
                    problems.append(f"{target}: {problem}")
        # Pass 2: one experiment arm chosen, as someone comparing would; queries still answer.
        pick = {"policy": "pooled", "arm": "cap2-vs-cap6:control", "experiment": "cap2-vs-cap6"}
        for path in DASHBOARDS:
            values, unresolved = resolve(prometheus, path, pick, window)
            problems += unresolved
            for target in targets(path):
                problem, _ = run_target(prometheus, target, values, window)
                if problem:
                    problems.append(f"{target} (policy=pooled, arm=control): {problem}")
        assert not problems, "panels that would show errors or nothing:\n" + "\n".join(problems)
    finally:
        prometheus.stop()
