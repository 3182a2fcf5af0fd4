"""Tables, charts and the bench/RESULTS.md section of one lab experiment run."""

from __future__ import annotations

import dataclasses
import math
import platform
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from bench.lab.experiments import DEFAULT_REPS, Experiment, experiment, resources_per_host
from bench.lab.network import Config, describe
from bench.lab.plot import COLORS, Chart, Panel, Point, Reference, Series
from bench.lab.profile import Profile
from bench.lab.runner import Cell, GroupCpu, Load
from bench.lab.sites import DESCRIPTIONS, HOSTS, Page, build_pages
from bench.lab.stats import Summary, summarize
from bench.runs import package_version


@dataclass(frozen=True)
class Run:
    """Everything a report needs about one run."""

    experiment: Experiment
    command: str
    started: str  # e.g. 2026-11-21 16:00 UTC
    minutes: float
    loads: list[Load]
    configs: list[Config]
    pages: dict[str, dict[str, Page]]  # variant -> name -> page
    machine: dict[str, str]
    group_cpu: list[GroupCpu] = field(default_factory=list)  # warm runs: CPU per cell
    profiles: dict[str, Profile] = field(default_factory=dict)  # --profile: tag -> profile

    def label(self, config: str) -> str:
        return next((c.title for c in self.configs if c.name == config), config)

    def as_json(self) -> dict[str, object]:
        """The run's record: enough to publish it again (`from_json`) without running it."""
        return {
            "experiment": self.experiment.name,
            "quick": self.experiment.quick,
            "reps": self.experiment.reps,
            # A part of the experiment (cli's --pages, --variants, --rtts, --profiled).
            "pages": list(self.experiment.pages),
            "variants": list(self.experiment.variants),
            "links": list(self.experiment.links),
            "profiled": self.experiment.profiled,
            "only_configs": list(self.experiment.only_configs),
            "command": self.command,
            "started": self.started,
            "minutes": self.minutes,
            "machine": self.machine,
            "configs": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "policy": c.policy and str(c.policy),
                    "label": c.label,
                    "workers": c.workers,
                }
                for c in self.configs
            ],
            "loads": [load.as_json() for load in self.loads],
            "group_cpu": [group.as_json() for group in self.group_cpu],
            "profiles": {tag: profile.as_json() for tag, profile in self.profiles.items()},
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Run:
        full = experiment(record["experiment"], quick=record["quick"])
        links = record.get("links", list(full.links))
        chosen = dataclasses.replace(
            full,
            reps=record["reps"],
            pages=tuple(record.get("pages", full.pages)),
            variants=tuple(record.get("variants", full.variants)),
            links={name: link for name, link in full.links.items() if name in links},
            profiled=record.get("profiled", full.profiled),
            only_configs=tuple(record.get("only_configs", ())),
        )
        return cls(
            chosen,
            record["command"],
            record["started"],
            record["minutes"],
            [Load(**_load_record(load)) for load in record["loads"]],
            [
                Config(
                    c["name"],
                    c["kind"],
                    c["policy"] and Path(c["policy"]),
                    c["label"],
                    c.get("workers", 1),
                )
                for c in record["configs"]
            ],
            _pages_again(chosen),
            record["machine"],
            [GroupCpu(**group) for group in record.get("group_cpu", [])],
            {tag: Profile.from_json(p) for tag, p in record.get("profiles", {}).items()},
        )


def _load_record(record: dict[str, Any]) -> dict[str, Any]:
    """A load's record as `Load` takes it. Records from before `origin_connections_new` counted
    only new origin connections, in `origin_connections` (a warm pool's showed as 0); records
    from before 2026-12-02 have no request start in their timings (0: not known)."""
    if "origin_connections_new" not in record:
        record = {**record, "origin_connections_new": record["origin_connections"]}
    timings = record.get("timings", [])
    if timings and len(timings[0]) == 4:
        record = {**record, "timings": [[url, start, 0.0, *rest] for url, start, *rest in timings]}
    return record


def _pages_again(chosen: Experiment) -> dict[str, dict[str, Page]]:
    """The run's pages, generated again (the same seed gives the same files; only the ports in
    their URLs differ, and no report uses those)."""
    with tempfile.TemporaryDirectory(prefix="reshape-lab-pages-") as scratch:
        roots = {host: Path(scratch) / host for host in HOSTS}
        bases = {host: f"https://{address}:1" for host, (address, _) in HOSTS.items()}
        return {
            variant: build_pages(roots, bases, variant, chosen.pages) for variant in chosen.variants
        }


DETAIL_HEADER = (
    "origins",
    "RTT",
    "config",
    "n",
    "median ms",
    "p90 ms",
    "interval",
    "vs direct",
    "browser conns",
    "origin conns",
    "peak/host",
    "MB to browser",
    "proxy CPU ms",
    "failed",
)


def heading(name: str) -> str:
    return f"## Lab: {name} (python -m bench.lab run {name})"


def summaries(loads: Sequence[Load]) -> dict[Cell, Summary]:
    values: dict[Cell, list[float]] = defaultdict(list)
    for load in loads:
        if load.plt_ms is not None:
            values[load.cell].append(load.plt_ms)
    return {cell: summarize(v) for cell, v in values.items()}


def failures(loads: Sequence[Load]) -> dict[Cell, int]:
    counts: dict[Cell, int] = defaultdict(int)
    for load in loads:
        if load.error is not None:
            counts[load.cell] += 1
    return counts


def cell_text(summary: Summary | None) -> str:
    if summary is None:
        return "failed"
    return f"{summary.median:,.0f} ({summary.low:,.0f}–{summary.high:,.0f})"


# --- plt --------------------------------------------------------------------------------------


def plt_tables(run: Run) -> dict[str, str]:
    """Page -> markdown: a compact table of medians per RTT, and every figure in <details>."""
    stats = summaries(run.loads)
    configs = configs_in(run)
    out = {}
    for page in run.experiment.pages:
        links = list(run.experiment.links)
        header = ["origins", "config", *(f"RTT {link}" for link in links)]
        rows = []
        for variant in run.experiment.variants:
            for config in configs:
                cells = [stats.get(Cell(variant, page, config, link)) for link in links]
                rows.append([variant, run.label(config), *(cell_text(s) for s in cells)])
        out[page] = (
            markdown_table(header, rows)
            + "\n\n<details><summary>every cell: p90, connections, proxy CPU</summary>\n\n"
            + markdown_table(DETAIL_HEADER, [row for _, row in detail_rows(run, page)])
            + "\n\n</details>"
        )
    return out


def detail_rows(run: Run, page: str) -> list[tuple[Cell, list[str]]]:
    """Every cell of `page` with its `detail_row`, by origin variant, RTT and configuration."""
    stats, failed = summaries(run.loads), failures(run.loads)
    rows = []
    for variant in run.experiment.variants:
        for link in run.experiment.links:
            direct = stats.get(Cell(variant, page, "direct", link))
            for config in configs_in(run):
                cell = Cell(variant, page, config, link)
                rows.append((cell, detail_row(run, cell, stats, failed, direct)))
    return rows


def plt_overview(run: Run) -> str:
    """Each config's median over direct's, per origin variant and RTT: the geometric mean of the
    ratios over the pages (and the range of the ratios)."""
    stats = summaries(run.loads)
    links = list(run.experiment.links)
    rows = []
    for variant in run.experiment.variants:
        for config in configs_in(run):
            if config == "direct":
                continue
            row = [variant, run.label(config)]
            for link in links:
                ratios = [
                    own.median / base.median
                    for page in run.experiment.pages
                    if (own := stats.get(Cell(variant, page, config, link)))
                    and (base := stats.get(Cell(variant, page, "direct", link)))
                ]
                if not ratios:
                    row.append("-")
                    continue
                mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
                row.append(
                    f"{_ratio_percent(mean)} ({_ratio_percent(min(ratios))} … "
                    f"{_ratio_percent(max(ratios))})"
                )
            rows.append(row)
    header = ["origins", "config", *(f"RTT {link}" for link in links)]
    return (
        "Load time against direct, all pages (geometric mean of the per-page ratios of medians; "
        "in brackets the best and worst page):\n\n" + markdown_table(header, rows)
    )


def plt_charts(run: Run, directory: Path) -> dict[Path, Chart]:
    stats = summaries(run.loads)

    def load_time(cell: Cell, rtt: float) -> Point | None:
        summary = stats.get(cell)
        return None if summary is None else Point(rtt, summary.median, summary.low, summary.high)

    charts = {}
    for page in run.experiment.pages:
        panels = rtt_panels(run, page, load_time)
        charts[directory / f"lab-plt-{page}.png"] = Chart(
            f"plt: {page}",
            "load time, median ms (whiskers: interval of the median)",
            panels,
            DESCRIPTIONS[page],
        )
    return charts


def rtt_panels(run: Run, page: str, point_of: Callable[[Cell, float], Point | None]) -> list[Panel]:
    """One panel per origin variant, x the RTT, a series per configuration of `point_of` (cell,
    RTT in ms): None where the cell has no value."""
    rtts = {link: float(link.split()[0]) for link in run.experiment.links}
    panels = []
    for variant in run.experiment.variants:
        panel = Panel(
            f"{variant} origins", "RTT between proxy and origins (ms)", x_ticks=[*rtts.values()]
        )
        for index, config in enumerate(configs_in(run)):
            points = [
                point
                for link, rtt in rtts.items()
                if (point := point_of(Cell(variant, page, config, link), rtt)) is not None
            ]
            if points:
                color = COLORS[index % len(COLORS)]
                panel.series.append(Series(run.label(config), points, color, config == "direct"))
        panels.append(panel)
    return panels


# --- booster ----------------------------------------------------------------------------------


def booster_tables(run: Run) -> dict[str, str]:
    stats, failed = summaries(run.loads), failures(run.loads)
    out = {}
    variant = run.experiment.variants[0]
    link = next(iter(run.experiment.links))
    for page in run.experiment.pages:
        r = resources_per_host(run.pages[variant][page])
        rule = max(1, r // 2)
        caps = _caps_in(run, page)
        direct = stats.get(Cell(variant, page, "direct", link))
        measured = {n: s for n in caps if (s := stats.get(Cell(variant, page, f"cap-{n}", link)))}
        best = min(measured, key=lambda n: measured[n].median) if measured else None
        header = [*DETAIL_HEADER[2:], ""]
        rows = []
        references = [c for c in configs_in(run) if not c.startswith("cap-")]
        for config in [*(f"cap-{n}" for n in caps), *references]:
            cell = Cell(variant, page, config, link)
            row = detail_row(run, cell, stats, failed, direct)[2:]
            notes = []
            if config == f"cap-{rule}":
                notes.append("rule N = R/2")
            if best is not None and config == f"cap-{best}":
                notes.append("best N")
            if config == "direct":
                notes.append("the browser's own 6")
            rows.append([*row, ", ".join(notes)])
        lines = [markdown_table(header, rows), ""]
        if best is not None and rule in measured:
            rule_ms, best_ms = measured[rule].median, measured[best].median
            text = (
                f"R = {r}. Best cap N = {best}: {best_ms:,.0f} ms. Rule N = R/2 = {rule}: "
                f"{rule_ms:,.0f} ms ({_percent(rule_ms, best_ms)} vs best)"
            )
            if direct is not None:
                text += (
                    f"; the browser's own 6 (direct): {direct.median:,.0f} ms "
                    f"(rule {_percent(rule_ms, direct.median)} vs direct)"
                )
            lines.append(text + ".")
        out[page] = "\n".join(lines)
    return out


def booster_overview(run: Run) -> str:
    """Per page: the best cap, the rule's cap, and the references."""
    stats = summaries(run.loads)
    variant = run.experiment.variants[0]
    link = next(iter(run.experiment.links))
    references = [c for c in configs_in(run) if not c.startswith("cap-")]
    header = ["page", "R", "best N", "best ms", "N = R/2", "rule ms", "rule vs best"]
    header += [f"{run.label(c)} ms" for c in references]
    rows = []
    for page in run.experiment.pages:
        r = resources_per_host(run.pages[variant][page])
        rule = max(1, r // 2)
        measured = {
            n: s
            for n in _caps_in(run, page)
            if (s := stats.get(Cell(variant, page, f"cap-{n}", link)))
        }
        if not measured:
            continue
        best = min(measured, key=lambda n: measured[n].median)
        rule_text = f"{measured[rule].median:,.0f}" if rule in measured else "-"
        versus = _percent(measured[rule].median, measured[best].median) if rule in measured else "-"
        row = [
            page,
            str(r),
            str(best),
            f"{measured[best].median:,.0f}",
            str(rule),
            rule_text,
            versus,
        ]
        for config in references:
            summary = stats.get(Cell(variant, page, config, link))
            row.append(f"{summary.median:,.0f}" if summary else "-")
        rows.append(row)
    return "Overview (medians):\n\n" + markdown_table(header, rows)


def booster_charts(run: Run, directory: Path) -> dict[Path, Chart]:
    stats = summaries(run.loads)
    variant = run.experiment.variants[0]
    link = next(iter(run.experiment.links))
    charts = {}
    for page in run.experiment.pages:
        r = resources_per_host(run.pages[variant][page])
        caps = _caps_in(run, page)
        panel = Panel(
            f"{variant} origins, {describe(run.experiment.links[link].origin)}",
            "reshape's connections per origin host (max_connections_per_host)",
            x_ticks=[float(n) for n in caps],
            markers=[(max(1, r // 2), "N = R/2")],
        )
        points = [
            Point(n, s.median, s.low, s.high)
            for n in caps
            if (s := stats.get(Cell(variant, page, f"cap-{n}", link))) is not None
        ]
        panel.series.append(Series("reshape with cap N", points, COLORS[0]))
        references = [c for c in configs_in(run) if not c.startswith("cap-")]
        for index, config in enumerate(references, start=1):
            summary = stats.get(Cell(variant, page, config, link))
            if summary is not None:
                name = run.label(config) + (" (browser's own 6)" if config == "direct" else "")
                panel.references.append(Reference(name, summary.median, COLORS[index]))
        charts[directory / f"lab-booster-{page}.png"] = Chart(
            f"booster: {page} (R = {r} resources on one host)",
            "load time, median ms",
            [panel],
            DESCRIPTIONS[page],
        )
    return charts


# --- the RESULTS.md section -------------------------------------------------------------------


def section(
    run: Run, tables: dict[str, str], plots: dict[str, list[str]], overview: str = ""
) -> str:
    """The whole section, heading included, ending in one newline. `plots`: page -> paths of its
    PNGs relative to RESULTS.md (pages without one get none)."""
    experiment = run.experiment
    failed = sum(1 for load in run.loads if load.error is not None)
    reps = experiment.reps
    errors = sorted({load.error for load in run.loads if load.error})[:3]
    parts = [
        heading(experiment.name),
        f"Recorded {run.started} with `{run.command}`: {len(run.loads)} page loads "
        f"({reps} repetitions, interleaved) in {run.minutes:.0f} min; {failed} failed"
        + (f" (e.g. {'; '.join(errors)})" if errors else "")
        + ".",
        f"What: {experiment.summary}.",
        *_notes(run),
        "Setup:\n\n" + "\n".join(f"- {line}" for line in _setup_lines(run)),
        "Figures: load time in ms (loadEventEnd, or for `news` and `app` the page's own "
        "mark that its script-driven requests have finished, whichever is later): median "
        "and, in brackets, the order-statistics interval of the median (≥95% coverage when "
        "there are enough loads; with 5 loads it is min–max, 93.8%; with 3, 75%). "
        "`browser conns`: TCP connections the browser opened; `origin conns`: connections to "
        "the origins, all hosts, that carried the load's requests; "
        + (
            "`new origin conns`: those of them opened during the load (a warm pool's were "
            "opened by earlier users); "
            if experiment.warm
            else "`peak/host`: most open at once to one origin host; "
        )
        + "`MB to browser`: bytes the browser received, TLS included; `proxy CPU ms`: CPU time of "
        + (
            "the proxy's processes over the cell's repetitions (the time between its loads "
            "included), divided by its loads; the other columns are medians over the loads."
            if experiment.warm
            else "the proxy's processes during the load; those columns are medians over the loads."
        ),
    ]
    if overview:
        parts.append(overview)
    for page in experiment.pages:
        description = DESCRIPTIONS[page]
        block = [f"### {page}: {description}"]
        block += [f"![{experiment.name} {page}]({plot})" for plot in plots.get(page, [])]
        block.append(tables[page])
        parts.append("\n\n".join(block))
    facts = "\n".join(f"- {key}: {value}" for key, value in {**run.machine, **versions()}.items())
    parts.append(f"Machine and versions:\n\n{facts}")
    return "\n\n".join(parts) + "\n"


def versions() -> dict[str, str]:
    return {
        "Chromium": _first_line(["/usr/bin/chromium", "--version"]),
        "nginx": _first_line(["/usr/sbin/nginx", "-v"]),
        "hypercorn": package_version("hypercorn"),
        "mitmproxy": package_version("mitmproxy"),
        "reshape": package_version("reshape"),
        "Python": platform.python_version(),
    }


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _setup_lines(run: Run) -> list[str]:
    experiment = run.experiment
    links = "; ".join(
        f"{name}: proxy ↔ origins {describe(links.origin)}, browser ↔ proxy "
        f"{describe(links.client)}"
        for name, links in experiment.links.items()
    )
    pages = run.pages[experiment.variants[0]]
    sizes = ", ".join(
        f"{name} {pages[name].requests} requests / {_size(pages[name].total_bytes)} / "
        f"{len(pages[name].hosts)} hosts"
        for name in experiment.pages
    )
    return [
        f"Links (user-space relays, labkit/relay.py): {links}. A TCP handshake through a "
        "relay costs one RTT (its connect delay); the TLS handshake and every request cost real "
        "round trips on top. Direct loads cross the same origin relays with both links chained. "
        "Not emulated: loss, jitter, reordering, queueing, TCP slow start of the emulated path.",
        f"Pages (seeded, bench/lab/sites.py): {sizes}.",
        "Origins: nginx (1 worker; h1 = no `http2`, h2 = `http2` via ALPN) on 127.0.0.2 …, "
        "and hypercorn (the app's origin, POSTs echoed) — each HTTPS behind its own relay on "
        "its own loopback address. Origins are verified by the proxies (`--upstream-ca`).",
        "Configs: "
        + _configs_text(run.configs)
        + (
            ". mitmdump: `mitmdump -q`, no addons"
            if any(c.kind == "mitmdump" for c in run.configs)
            else ""
        )
        + (
            ". engine floor: bench/lab/engine_floor.py, reshape's engine and the policy's routes"
            " behind a minimal CONNECT + TLS + HTTP/2 front end, no mitmproxy"
            if any(c.kind == "engine-floor" for c in run.configs)
            else ""
        )
        + ". Every proxy listens behind its own relay on 127.0.0.1.",
        "Browser: Debian's Chromium, headless, one browser process and a fresh browser context "
        "per load (empty cache, no cookies, no connections), QUIC off; bodies are not read "
        "back, but every status (200) and every body size is checked.",
        _connections_line(experiment),
        "Every process (Chromium, proxy, relays, origins) shares the same 2 cores; figures are "
        "comparable within this run only.",
    ]


def _connections_line(experiment: Experiment) -> str:
    if experiment.warm:
        return (
            "Connections live across loads, as at a gateway serving user after user: each "
            "proxy runs through all the loads of a cell, and nothing closes connections between "
            "loads, so reshape's pool stays warm across users, while the browser (a fresh "
            "context per load), direct or through mitmdump, keeps nothing from one user to the "
            "next. Loads go in groups of one page, origin variant and RTT: all connections are "
            "closed when a group starts, one unrecorded load per configuration warms it (8 for "
            "2 worker processes, each with a pool of its own: bench/lab/runner.py, "
            "`warm_up_loads`), then its repetitions alternate the configurations. Origins keep "
            "idle connections 65 s, reshape's pool 60 s."
        )
    return (
        "Between loads every relay closes all its connections: each load starts cold, also in "
        "reshape's pool (no connection or TLS session survives in the relays, though reshape "
        "may resume TLS sessions it cached)."
    )


def detail_row(
    run: Run,
    cell: Cell,
    stats: dict[Cell, Summary],
    failed: dict[Cell, int],
    direct: Summary | None,
) -> list[str]:
    loads = [load for load in run.loads if load.cell == cell and load.error is None]
    summary = stats.get(cell)
    if summary is None:
        figures = ["0", "-", "-", "-", "-"]
    else:
        figures = [
            str(summary.n),
            f"{summary.median:,.0f}",
            f"{summary.p90:,.0f}",
            f"{summary.low:,.0f}–{summary.high:,.0f} ({summary.coverage:.0%})",
            _percent(summary.median, direct.median) if direct and cell.config != "direct" else "",
        ]

    def typical(values: list[float]) -> str:
        return f"{median(values):,.0f}" if values else "-"

    return [
        cell.variant,
        cell.link,
        run.label(cell.config),
        *figures,
        typical([load.browser_connections for load in loads]),
        typical([load.origin_connections for load in loads]),
        typical([load.origin_peak_per_host for load in loads]),
        f"{median(load.browser_bytes for load in loads) / 1e6:.2f}" if loads else "-",
        typical([load.proxy_cpu_ms for load in loads if load.proxy_cpu_ms is not None]),
        str(failed.get(cell, 0)),
    ]


def configs_in(run: Run) -> list[str]:
    seen = {load.config for load in run.loads}
    return [c.name for c in run.configs if c.name in seen]


def _caps_in(run: Run, page: str) -> list[int]:
    caps = {
        int(load.config[4:])
        for load in run.loads
        if load.page == page and load.config.startswith("cap-")
    }
    return sorted(caps)


def _size(count: int) -> str:
    if count >= 1e6:
        return f"{count / 1e6:.1f} MB"
    return f"{count / 1e3:.1f} KB" if count >= 1e3 else f"{count} bytes"


def _ratio_percent(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f}%"


def _percent(value: float, base: float) -> str:
    return f"{(value / base - 1) * 100:+.0f}%" if base else "-"


def _notes(run: Run) -> list[str]:
    notes = []
    if not run.experiment.quick and run.experiment.reps < DEFAULT_REPS:
        notes.append(
            f"**Reduced run**: {run.experiment.reps} repetitions per cell instead of "
            f"{DEFAULT_REPS}, to keep a shared machine's time; intervals are wider (the "
            f"min–max of {run.experiment.reps} loads holds the median with "
            f"{1 - 2 / 2**run.experiment.reps:.0%} probability)."
        )
    cores = int(run.machine.get("cores (nproc)", "0") or 0)
    loads = run.machine.get("load average at start", "").split()
    if cores and loads and float(loads[0]) > cores / 2:
        notes.append(
            f"**Busy machine**: load average {loads[0]} on {cores} cores at the start "
            f"({run.machine.get('load average at end', '?').split()[0]} at the end, the lab's "
            "own processes included): whatever else ran before or beside the run adds noise "
            "and CPU delay to every configuration; the interleaved order spreads it evenly, so "
            "compare rows within this run only."
        )
    return notes


def _configs_text(configs: Sequence[Config]) -> str:
    repo = Path(__file__).resolve().parents[2]
    named = [
        c.title
        + (f" = {_policy_text(c.policy, repo)}" if c.policy else "")
        + (f" with `--workers {c.workers}`" if c.workers != 1 else "")
        for c in configs
        if not c.name.startswith("cap-")
    ]
    caps = sorted(int(c.name[4:]) for c in configs if c.name.startswith("cap-"))
    if caps:
        named.append(
            f"reshape, cap N (N = {', '.join(map(str, caps))}) = a generated policy "
            "`upstream: {max_connections_per_host: N}`"
        )
    return "; ".join(named)


def _policy_text(policy: Path, repo: Path) -> str:
    """The policy file's path in the repository, or (generated in the run's workdir, which may
    be gone by now) just that."""
    resolved = policy.resolve()
    return f"`{resolved.relative_to(repo)}`" if resolved.is_relative_to(repo) else "generated"


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError as error:
        return f"unknown ({error})"
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "unexpected" not in line]
    return lines[0].strip() if lines else "unknown"
