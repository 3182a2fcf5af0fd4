"""Tables, charts and profile of the lab's `gateway` experiment (its section is report.py's).

Per page: load time per origin variant, configuration and RTT (median and the interval of the
median), the proxies' CPU per load (over each cell's repetitions, `GroupCpu`), when each phase
of the page ended, each phase's wait for first bytes and start-up (Resource Timing), and every
cell's detail. The overview checks issue 17's targets (`gateway.TARGETS`) cell by cell; with
--profile, the pooled proxy's py-spy breakdown follows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import median

from bench.lab.gateway import DIRECT, POOLED, TARGETS, Target
from bench.lab.plot import Chart, Point
from bench.lab.profile import Profile
from bench.lab.report import (
    DETAIL_HEADER,
    Run,
    cell_text,
    configs_in,
    detail_rows,
    markdown_table,
    plt_charts,
    rtt_panels,
    summaries,
)
from bench.lab.runner import Cell
from bench.lab.sites import PHASES, phase_of
from bench.lab.stats import Summary

PROFILE_TOP = 25  # functions listed, by self and by inclusive samples
PROFILE_AREAS = 18
PROFILE_CALLERS_OF = 6  # top self-time functions whose callers are listed
PROFILE_CALLERS = 4


def cpu_per_load(run: Run) -> dict[Cell, float]:
    """Each proxy cell's CPU ms per load over its repetitions (warm runs), else the median of
    the per-load readings."""
    if run.group_cpu:
        return {group.cell: group.per_load_ms for group in run.group_cpu}
    readings: dict[Cell, list[float]] = {}
    for load in run.loads:
        if load.proxy_cpu_ms is not None and load.error is None:
            readings.setdefault(load.cell, []).append(load.proxy_cpu_ms)
    return {cell: median(values) for cell, values in readings.items()}


def gateway_tables(run: Run) -> dict[str, str]:
    stats, cpu = summaries(run.loads), cpu_per_load(run)
    configs = configs_in(run)
    links = list(run.experiment.links)
    out = {}
    for page in run.experiment.pages:
        header = ["origins", "config", *(f"RTT {link}" for link in links)]
        times, cpus = [], []
        for variant in run.experiment.variants:
            for config in configs:
                cells = [Cell(variant, page, config, link) for link in links]
                label = run.label(config)
                times.append([variant, label, *(cell_text(stats.get(c)) for c in cells)])
                if config != DIRECT:
                    cpus.append([variant, label, *(_ms(cpu.get(c)) for c in cells)])
        # Relays count every proxy's connections together, and pools stay open across loads:
        # the most open at once to one origin host says nothing of one config.
        # Instead, how many of the connections that carried the load were new: a warm pool's
        # were opened by earlier users.
        detail_header = ["new origin conns" if h == "peak/host" else h for h in DETAIL_HEADER]
        new = _new_origin_connections(run, page)
        detail = []
        for cell, row in detail_rows(run, page):
            if cell.config != DIRECT:
                row[DETAIL_HEADER.index("proxy CPU ms")] = _ms(cpu.get(cell))
            row[DETAIL_HEADER.index("peak/host")] = new.get(cell, "-")
            detail.append(row)
        phases = "\n\n".join(t for t in (phase_table(run, page), step_table(run, page)) if t)
        out[page] = (
            "Load time, ms: median (interval of the median)\n\n"
            + markdown_table(header, times)
            + "\n\nProxy CPU per load, ms (CPU time of the proxy's process tree over the cell's "
            "repetitions, divided by its loads)\n\n"
            + markdown_table(header, cpus)
            + (f"\n\n{phases}" if phases else "")
            + "\n\n<details><summary>every cell: p90, connections, proxy CPU</summary>\n\n"
            + markdown_table(detail_header, detail)
            + "\n\n</details>"
        )
    return out


def _new_origin_connections(run: Run, page: str) -> dict[Cell, str]:
    """Per cell of `page`, the median number of origin connections its loads opened."""
    counts: dict[Cell, list[int]] = {}
    for load in run.loads:
        if load.page == page and load.error is None:
            counts.setdefault(load.cell, []).append(load.origin_connections_new)
    return {cell: f"{median(values):,.0f}" for cell, values in counts.items()}


def phase_table(run: Run, page: str) -> str:
    """When each phase of the page ended (Resource Timing, ms from navigation start; medians),
    per cell: where a configuration gains or loses its time. The first two columns are the
    HTML's own exchange (Navigation Timing): its connection ready, its first byte back."""
    names = PHASES.get(page)
    if not names:
        return ""
    ends: dict[Cell, list[dict[str, float]]] = {}
    for load in run.loads:
        if load.page != page or load.error is not None or not load.timings:
            continue
        phase_end: dict[str, float] = {"document": min(t[1] for t in load.timings)}
        if load.navigation is not None:
            phase_end["connected"], _, phase_end["HTML 1st byte"], _ = load.navigation
        for url, _, _, _, end in load.timings:
            phase = phase_of(page, url)
            if phase is not None:
                phase_end[phase] = max(phase_end.get(phase, 0.0), end)
        ends.setdefault(load.cell, []).append(phase_end)
    columns = ("connected", "HTML 1st byte", "document", *names)
    return (
        "<details><summary>when each phase ended, ms (medians; `connected`: the HTML's "
        "connection ready (TCP and TLS; through a proxy, the tunnel and TLS); `HTML 1st byte`: "
        "its first byte back; `document`: the first subresource's start, i.e. the HTML has "
        "arrived)</summary>\n\n"
        + markdown_table(
            ["origins", "RTT", "config", *columns], _median_rows(run, page, ends, columns)
        )
        + "\n\n</details>"
    )


def step_table(run: Run, page: str) -> str:
    """Per phase of the page, two figures per cell from Resource Timing (medians over loads):
    the phase's wait, its requests' median time from request sent to first byte back (the
    round trip, the origin, and a proxy's work on both legs), and its start-up, from the
    phase's first resource asked for to its first request sent (connections not yet open:
    direct, new TCP and TLS to the origin; through a proxy, the tunnel and TLS to the proxy).
    Needs the origins' Timing-Allow-Origin (labkit's send it) for cross-origin phases."""
    names = PHASES.get(page)
    if not names:
        return ""
    waits: dict[Cell, list[dict[str, float]]] = {}
    startups: dict[Cell, list[dict[str, float]]] = {}
    for load in run.loads:
        if load.page != page or load.error is not None or not load.timings:
            continue
        by_phase: dict[str, list[tuple[float, float, float]]] = {}
        for url, start, request_start, response_start, _ in load.timings:
            phase = phase_of(page, url)
            if phase is not None and 0 < request_start <= response_start:
                by_phase.setdefault(phase, []).append((start, request_start, response_start))
        waits.setdefault(load.cell, []).append(
            {name: median(rs - rq for _, rq, rs in got) for name, got in by_phase.items()}
        )
        startups.setdefault(load.cell, []).append(
            {
                name: min(rq for _, rq, _ in got) - min(start for start, _, _ in got)
                for name, got in by_phase.items()
            }
        )
    header = ["origins", "RTT", "config", *names]
    return (
        "<details><summary>each phase's exchanges, ms (medians over loads): `wait`, its "
        "requests' median time from request sent to first byte back (Resource Timing's "
        "responseStart − requestStart: the round trip, the origin, a proxy's work on both "
        "legs); `start-up`, from its first resource asked for to its first request sent "
        "(connections to open: direct, TCP and TLS to a new origin; through a proxy, the "
        "tunnel and TLS to the proxy)</summary>\n\nwait\n\n"
        + markdown_table(header, _median_rows(run, page, waits, names))
        + "\n\nstart-up\n\n"
        + markdown_table(header, _median_rows(run, page, startups, names))
        + "\n\n</details>"
    )


def _median_rows(
    run: Run, page: str, values: dict[Cell, list[dict[str, float]]], columns: Sequence[str]
) -> list[list[str]]:
    """One row per cell of `page`: the median over its loads of each column's value."""
    rows = []
    for variant in run.experiment.variants:
        for link in run.experiment.links:
            for config in configs_in(run):
                loads = values.get(Cell(variant, page, config, link), [])
                row = [variant, link, run.label(config)]
                for name in columns:
                    found = [v[name] for v in loads if name in v]
                    row.append(f"{median(found):,.0f}" if found else "-")
                rows.append(row)
    return rows


def gateway_overview(run: Run) -> str:
    """Issue 17's targets, cell by cell; the other configurations against direct; the profile."""
    parts = [targets_table(run), versus_direct(run)]
    profiled = run.experiment.profiled
    if run.profiles and profiled is not None:
        cpu = [g.cpu_ms for g in run.group_cpu if g.config == profiled]
        parts.append(profile_text(run.profiles, sum(cpu) if cpu else None, run.label(profiled)))
    return "\n\n".join(parts)


def targets_table(run: Run) -> str:
    stats, cpu = summaries(run.loads), cpu_per_load(run)
    header = ["target", "page", "origins", "RTT", "pooled", "reference", "ratio", "range", ""]
    rows = []
    held = total = 0
    for target in TARGETS:
        for page in run.experiment.pages:
            for variant in run.experiment.variants:
                for link in run.experiment.links:
                    if target.link is not None and link != target.link:
                        continue
                    row = _target_row(target, Cell(variant, page, POOLED, link), stats, cpu)
                    if row is None:
                        continue
                    total += 1
                    held += row[-1].startswith("met")
                    rows.append([target.what, page, variant, link, *row])
    return (
        f"Issue 17's targets, cell by cell ({held} of {total} met). `ratio`: pooled over the "
        "reference, medians (CPU: per load over the cell); `range`: the ratio's bounds from the "
        "two intervals of the median (pooled's low over the reference's high … pooled's high "
        "over the reference's low) — a target is met when the ratio is within it, and safely "
        "met when the whole range is.\n\n" + markdown_table(header, rows)
    )


def _target_row(
    target: Target, cell: Cell, stats: dict[Cell, Summary], cpu: dict[Cell, float]
) -> list[str] | None:
    reference = Cell(cell.variant, cell.page, target.reference, cell.link)
    if target.cpu:
        own, base = cpu.get(cell), cpu.get(reference)
        if own is None or base is None or not base:
            return None
        ratio = own / base
        return [_ms(own), _ms(base), f"{ratio:.2f}", "", _verdict(ratio, ratio, target.ratio)]
    mine, theirs = stats.get(cell), stats.get(reference)
    if mine is None or theirs is None:
        return None
    ratio = mine.median / theirs.median
    low, high = mine.low / theirs.high, mine.high / theirs.low
    return [
        f"{mine.median:,.0f}",
        f"{theirs.median:,.0f}",
        f"{ratio:.2f}",
        f"{low:.2f}–{high:.2f}",
        _verdict(ratio, high, target.ratio),
    ]


def _verdict(ratio: float, worst: float, limit: float) -> str:
    if ratio > limit:
        return "missed"
    return "met" if worst <= limit else "met (range crosses)"


def versus_direct(run: Run) -> str:
    stats = summaries(run.loads)
    links = list(run.experiment.links)
    header = ["page", "origins", "config", *(f"RTT {link}" for link in links)]
    rows = []
    for page in run.experiment.pages:
        for variant in run.experiment.variants:
            for config in configs_in(run):
                if config == DIRECT:
                    continue
                cells = []
                for link in links:
                    own = stats.get(Cell(variant, page, config, link))
                    base = stats.get(Cell(variant, page, DIRECT, link))
                    cells.append(f"{own.median / base.median:.2f}×" if own and base else "-")
                rows.append([page, variant, run.label(config), *cells])
    return "Load time over direct's (ratio of medians):\n\n" + markdown_table(header, rows)


def profile_text(
    profiles: dict[str, Profile], cpu_ms: float | None = None, label: str = "pooled"
) -> str:
    """The profiled proxy's (`label`) py-spy breakdown: all recordings together, by area and by
    function. `cpu_ms`: the proxy's CPU time over the same recordings, if known."""
    total = Profile()
    for profile in profiles.values():
        total = total.merged(profile)
    if not total.samples:
        return "Profile: py-spy recorded no busy samples."
    busy_ms = total.samples * 1000 / total.rate
    waiting = (
        f" Over the same windows the proxy's CPU time was {cpu_ms / 1000:,.1f} s: of the "
        f"{busy_ms / 1000:,.1f} s it was busy (running, or runnable and waiting for a core: "
        f"py-spy cannot tell them apart), it waited for a core {1 - cpu_ms / busy_ms:.0%}."
        if cpu_ms is not None and busy_ms >= cpu_ms
        else ""
    )
    per_tag = [
        [tag, f"{p.samples:,}", f"{p.seconds:,.0f}", f"{p.busy_share:.0%}"]
        for tag, p in profiles.items()
    ]

    def share(count: int) -> str:
        return f"{count / total.samples:.1%}"

    areas = sorted(total.areas_inclusive, key=lambda a: -total.areas_self[a])[:PROFILE_AREAS]
    area_rows = [
        [f"`{a}`", share(total.areas_self[a]), share(total.areas_inclusive[a])] for a in areas
    ]
    by_self = [
        [f"`{f}`", share(n), share(total.functions_inclusive[f])]
        for f, n in total.functions_self.most_common(PROFILE_TOP)
    ]
    caller_rows = []
    for function, _ in total.functions_self.most_common(PROFILE_CALLERS_OF):
        calls = Counter({c: n for (f, c), n in total.callers.items() if f == function}).most_common(
            PROFILE_CALLERS
        )
        for caller, count in calls:
            caller_rows.append([f"`{function}`", f"`{caller}`", share(count)])
    by_inclusive = [
        [f"`{f}`", share(total.functions_self[f]), share(n)]
        for f, n in total.functions_inclusive.most_common(PROFILE_TOP)
    ]
    return "\n\n".join(
        [
            f"Profile of the {label} proxy (py-spy {total.rate} Hz, non-blocking: the proxy is "
            "never paused) during the measured loads of every cell, warm-ups excluded: "
            f"{total.samples:,} busy samples over {total.seconds:,.0f} s of wall time "
            f"({total.busy_share:.0%} of one core on average; the proxy also idles while the "
            "other configurations load). Shares are of the busy samples; `self`: the function "
            "itself was running (C code it calls included: OpenSSL, the socket), `inclusive`: "
            "it was anywhere on the stack; `Runner.run`'s self time is the event loop's own C "
            "code (uvloop: polling, socket reads and writes) and the time the proxy, woken, "
            "waited for a core." + waiting,
            "Per page and origins (all RTTs):\n\n"
            + markdown_table(["recording", "busy samples", "wall s", "busy share"], per_tag),
            "By area (a package, or a subpackage of mitmproxy and reshape):\n\n"
            + markdown_table(["area", "self", "inclusive"], area_rows),
            f"Top {PROFILE_TOP} functions by self time:\n\n"
            + markdown_table(["function", "self", "inclusive"], by_self),
            f"Top {PROFILE_TOP} functions by inclusive time:\n\n"
            + markdown_table(["function", "self", "inclusive"], by_inclusive),
            f"Who calls the top {PROFILE_CALLERS_OF} functions by self time (their self samples "
            "by direct caller):\n\n"
            + markdown_table(["function", "called from", "self"], caller_rows),
        ]
    )


def gateway_charts(run: Run, directory: Path) -> dict[Path, Chart]:
    """Per page: load time against RTT (the plt charts), and the proxies' CPU per load."""
    charts = {}
    for path, chart in plt_charts(run, directory).items():
        page = path.stem.removeprefix("lab-plt-")
        chart.title = f"gateway: {page}"
        charts[directory / f"lab-gateway-{page}.png"] = chart
    cpu = cpu_per_load(run)

    def cpu_point(cell: Cell, rtt: float) -> Point | None:
        value = cpu.get(cell)
        return None if value is None or not math.isfinite(value) else Point(rtt, value)

    for page in run.experiment.pages:
        panels = rtt_panels(run, page, cpu_point)
        charts[directory / f"lab-gateway-{page}-cpu.png"] = Chart(
            f"gateway: {page}, proxy CPU",
            "proxy CPU per page load, ms",
            panels,
            "CPU time of the proxy's processes over the cell's loads, per load",
        )
    return charts


def _ms(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.0f}"
