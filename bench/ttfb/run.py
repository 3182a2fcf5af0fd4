"""bench/ttfb: when the first bytes of a page become usable, and when it first paints, through
reshape over a slow link, with dynamic TLS record sizes and with 16 KB records.

One nginx origin (HTTPS, HTTP/1.1) on 127.0.0.2 serves a 300 KB HTML page that loads a stylesheet
from its head and shows an image at its top, more images further down. Headless Chromium loads it
through an emulated link (default 1.5 Mbit/s towards the browser, 100 ms RTT) in front of one of:
reshape with `tls_records: {mode: dynamic}`, reshape without it (OpenSSL's 16 KB records), and
plain mitmdump. Two links: bench/labkit's relay, which paces whole reads, and bench/ttfb_link's,
which delivers TCP-segment-sized pieces. Rounds are interleaved: each round loads the page once per
link and configuration, in an order rotated from round to round. The table goes to stdout and,
unless --no-record, into bench/RESULTS.md.

Run it as `python -m bench.ttfb` (see its `--help`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import random
import statistics
from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict
from pathlib import Path

from bench import runs
from bench.overhead import peers
from bench.overhead.peers import ProxyStartError, RunningProxy
from bench.ttfb.browser import FIRST_BYTES_MARK, PageTiming, timed_load
from bench.ttfb.link import SegmentLink, SegmentRelay
from bench.ttfb.report import BASELINE, HEADING, Row, section, table
from labkit.browser import CHROMIUM, PageLoadError
from labkit.origins import OriginStartError, nginx_origin
from labkit.pki import OriginPKI
from labkit.relay import Link, relays
from labkit.sites import png

BENCH = runs.Bench("ttfb")
say = BENCH.say
ORIGIN_HOST = "127.0.0.2"
CONFIGS = ("reshape-dynamic", "reshape-16k", "mitmdump")
LINKS = ("relay", "segments")
PAGE_BYTES = 300 * 1024
DYNAMIC_POLICY = """\
version: 1
default: dynamic
policies:
  dynamic:
    tls_records: {mode: dynamic}
"""
PLAIN_POLICY = "version: 1\ndefault: plain\npolicies:\n  plain: {}\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ttfb",
        description="First usable bytes and first paint in Chromium over a slow link, through "
        "reshape with dynamic or 16 KB TLS records, and through mitmdump.",
    )
    parser.add_argument("--repeat", type=int, help="interleaved rounds (default 7; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="smoke test: one round")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset")
    parser.add_argument("--links", default=",".join(LINKS), help="relay, segments or both")
    parser.add_argument("--down-kbit", type=float, default=1500.0, help="kbit/s to the browser")
    parser.add_argument("--rtt-ms", type=float, default=100.0, help="round-trip time")
    runs.add_output_arguments(parser, figures="load")
    args = parser.parse_args(argv)
    args.configs = list(dict.fromkeys(args.configs.split(",")))
    args.links = list(dict.fromkeys(args.links.split(",")))
    if set(args.configs) - set(CONFIGS) or set(args.links) - set(LINKS):
        parser.error(f"--configs from {','.join(CONFIGS)}; --links from {','.join(LINKS)}")
    args.repeat = args.repeat or (1 if args.quick else 7)
    if args.repeat < 1 or args.down_kbit <= 0 or args.rtt_ms < 0:
        parser.error("--repeat and --down-kbit must be positive, --rtt-ms not negative")
    return args


def main(argv: Sequence[str]) -> int:
    return BENCH.main(argv, parse_args, _run, (ProxyStartError, OriginStartError))


def write_site(root: Path, seed: int = 1) -> tuple[str, dict[str, bytes]]:
    """Writes the page and its subresources under root/ttfb/; (page path, path → content)."""
    rng = random.Random(seed)
    directory = root / "ttfb"
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    rules = [f".c{i} {{ color: #{rng.randrange(0x1000000):06x}; }}" for i in range(200)]
    files["ttfb/style.css"] = ("body { font: 16px serif; }\n" + "\n".join(rules) + "\n").encode()
    for name, side in (("hero", 100), ("a", 80), ("b", 80), ("c", 80)):
        files[f"ttfb/{name}.png"] = png(side, side, rng)
    words = ("origin", "proxy", "record", "segment", "byte", "paint", "page", "socket", "link")
    head = [
        "<!doctype html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        # The first thing parsed: its time is when the HTML's first bytes were usable.
        f"<script>performance.mark('{FIRST_BYTES_MARK}')</script>",
        "<title>reshape ttfb page</title>",
        '<link rel="icon" href="data:,">',
        '<link rel="stylesheet" href="/ttfb/style.css">',
        "</head>",
        "<body>",
        "<h1>First paint</h1>",
        '<p class="c1">The first words of a long page.</p>',
        '<img src="/ttfb/hero.png" alt="hero" width="100" height="100">',
    ]
    body: list[str] = []
    size = sum(len(line) + 1 for line in head)
    later_images = ["a", "b", "c"]
    while size < PAGE_BYTES - 100:
        if later_images and size > PAGE_BYTES * (4 - len(later_images)) // 4:
            image = later_images.pop(0)
            body.append(f'<img src="/ttfb/{image}.png" alt="{image}" width="80" height="80">')
        text = " ".join(rng.choice(words) for _ in range(80))
        body.append(f'<p class="c{rng.randrange(200)}">{text}.</p>')
        size += len(body[-1]) + 1
    files["ttfb/index.html"] = "\n".join([*head, *body, "</body>", "</html>", ""]).encode()
    for relative, data in files.items():
        (root / relative).write_bytes(data)
    return "ttfb/index.html", files


def _proxy(config: str, workdir: Path, origin_ca: Path) -> AbstractContextManager[RunningProxy]:
    workdir.mkdir(parents=True, exist_ok=True)
    if config == "mitmdump":
        return peers.mitmdump(workdir, origin_ca)
    policy = workdir / "policy.yaml"
    policy.write_text(DYNAMIC_POLICY if config == "reshape-dynamic" else PLAIN_POLICY)
    return peers.reshape(workdir, origin_ca, policy)


def _run(args: argparse.Namespace, command: str) -> int:
    facts = runs.machine()
    busy = _busy_machine_notes()
    started = datetime.datetime.now(datetime.UTC)
    rate = args.down_kbit * 1000 / 8
    half_rtt = args.rtt_ms / 1000 / 2
    loads: list[dict[str, object]] = []
    with BENCH.workdir(args.workdir, must_be_empty=False) as workdir, ExitStack() as stack:
        pki = OriginPKI(workdir / "pki")
        page, files = write_site(workdir / "www")
        page_bytes = len(files[page])
        total_bytes = sum(len(data) for data in files.values())
        origin = stack.enter_context(
            nginx_origin(
                workdir / "www",
                ORIGIN_HOST,
                tls=pki.issue([ORIGIN_HOST]),
                # HTTP/1.1, not HTTP/2: nginx's HTTP/2 sends 8 KB DATA frames, each of which
                # mitmproxy relays as a write of its own, so the baseline's records would be 8 KB.
                http2=False,
                workdir=workdir / "nginx",
            )
        )
        expected = {
            origin.url(path): hashlib.sha256(data).hexdigest() for path, data in files.items()
        }
        proxies = {
            config: stack.enter_context(_proxy(config, workdir / config, pki.ca_cert_path))
            for config in args.configs
        }
        thread = stack.enter_context(relays())
        ports: dict[tuple[str, str], int] = {}
        for config, proxy in proxies.items():
            target = ("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))
            if "relay" in args.links:
                link = Link(
                    up_delay=half_rtt, down_delay=half_rtt, down_rate=rate, shared_down_rate=rate
                )
                ports["relay", config] = thread.add("127.0.0.1", target, link).port
            if "segments" in args.links:
                segments = SegmentLink(down_rate=rate, up_delay=half_rtt, down_delay=half_rtt)
                relay = thread.run(SegmentRelay("127.0.0.1", target, segments))
                ports["segments", config] = relay.port

        def load(link: str, config: str) -> PageTiming:
            return timed_load(
                origin.url(page),
                proxy=f"127.0.0.1:{ports[link, config]}",
                trusted_ca=proxies[config].https_ca,
                expected=expected,
            )

        order = [(link, config) for link in args.links for config in args.configs]
        timings: dict[tuple[str, str], list[PageTiming]] = {key: [] for key in order}
        failures = dict.fromkeys(order, 0)
        if not args.quick:
            say("warm-up: one unmeasured load per configuration")
            for config in args.configs:
                with contextlib.suppress(PageLoadError):
                    load(args.links[0], config)
        for round_number in range(1, args.repeat + 1):
            shift = (round_number - 1) % len(order)
            for link, config in order[shift:] + order[:shift]:
                try:
                    timing = load(link, config)
                except PageLoadError as error:
                    failures[link, config] += 1
                    say(f"round {round_number}: {link} {config}: FAILED: {error}")
                    continue
                timings[link, config].append(timing)
                loads.append({"round": round_number, "link": link, "config": config})
                loads[-1].update(asdict(timing))
                say(
                    f"round {round_number}: {link:8} {config:15} first bytes "
                    f"{timing.first_bytes_ms:5.0f} ms, FCP {timing.fcp_ms:5.0f} ms, "
                    f"load {timing.load_ms:5.0f} ms"
                )
    rows = [
        Row(link, config, tuple(timings[link, config]), failures[link, config])
        for link, config in order
    ]
    facts["load average at end"] = runs.load_average()
    facts.update(_versions())

    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(loads, indent=1) + "\n")
    if runs.publish(
        args,
        HEADING,
        section(
            when=started.strftime("%Y-%m-%d %H:%M UTC"),
            command=command,
            setup=_setup_text(args, page_bytes, total_bytes),
            rows=rows,
            notes="\n".join([_notes(rows, args.down_kbit), *busy]),
            facts=facts,
        ),
        header=None,
    ):
        say(f"recorded in {args.results}")
    return 1 if any(row.failures for row in rows) else 0


def _versions() -> dict[str, str]:
    found = {
        "nginx": runs.first_line(["/usr/sbin/nginx", "-v"]),
        "Chromium": runs.first_line([str(CHROMIUM), "--version"]),
        "mitmproxy": importlib.metadata.version("mitmproxy"),
        "Python": platform.python_version(),
    }
    return found


def _setup_text(args: argparse.Namespace, page_bytes: int, total_bytes: int) -> str:
    return "\n".join(
        [
            f"- Page: {page_bytes:,} bytes of HTML from nginx on {ORIGIN_HOST} over HTTPS; its "
            "head loads one render-blocking stylesheet (the first thing parsed is an inline "
            "script that sets a performance mark), an image at its top and three further down: "
            f"{total_bytes:,} bytes in all. Chromium speaks HTTP/2 to the proxy, the proxy "
            "HTTP/1.1 to nginx: from an HTTP/2 nginx, mitmproxy relays each 8 KB DATA frame as a "
            "write of its own, and the baseline's records would be ~8 KB, not 16 KB.",
            f"- Link between Chromium and the proxy: {args.down_kbit:g} kbit/s towards the "
            f"browser, unlimited towards the proxy, {args.rtt_ms:g} ms RTT (half each way). "
            "All connections of a load share the link. `relay`: labkit/relay.py, which "
            "paces whole reads (a write of the proxy, up to 64 KB, arrives at once); `segments`: "
            "bench/ttfb/link.py, which delivers 1,448-byte pieces one after the other at the "
            "link's rate, as TCP segments would arrive.",
            "- Configurations: `reshape-dynamic` is reshape with `tls_records: {mode: dynamic}` "
            "(1,400-byte records for the first MB of a connection, 16 KB after, small again "
            "after 1 s idle); `reshape-16k` is reshape without the section (OpenSSL's 16 KB "
            "records); `mitmdump` is plain mitmdump, the reference.",
            "- Each load is a fresh headless Chromium (fresh profile, so fresh connections: every "
            f"load starts the warm-up from zero). {args.repeat} interleaved rounds"
            + (", after one unmeasured load per configuration" if not args.quick else "")
            + "; each round loads the page once per link and configuration, in an order rotated "
            "from round to round.",
            "- Columns, in ms from navigation start, medians: first bytes usable (the mark set by "
            "the page's first script), response head (Navigation Timing responseStart), head → "
            "first bytes (the difference of the two, per load: what the first record costs, "
            "without the noise of connection set-up), FCP, HTML done (responseEnd), load "
            "(loadEventEnd). Δ vs 16k: the row's median minus reshape-16k's over the same link.",
        ]
    )


def _notes(rows: Sequence[Row], down_kbit: float) -> str:
    lines = []
    for link in dict.fromkeys(row.link for row in rows):
        dynamic = next((r for r in rows if r.link == link and r.config == "reshape-dynamic"), None)
        full = next((r for r in rows if r.link == link and r.config == BASELINE), None)
        if dynamic is None or full is None:
            continue
        gap = _difference(dynamic, full, "head_to_first_bytes_ms")
        fcp = _difference(dynamic, full, "fcp_ms")
        spread = _quartiles(dynamic.timings + full.timings, "fcp_ms")
        if gap is not None and fcp is not None and spread:
            lines.append(
                f"- Over `{link}`, dynamic records changed the median time from the response head "
                f"to the first usable bytes by {gap:+.0f} ms and FCP by {fcp:+.0f} ms, against "
                f"16 KB records (FCP's quartiles over both rows' loads: {spread})."
            )
    full_record_ms = (16_384 + 17) * 8 / (down_kbit * 1000) * 1000
    small_record_ms = (1400 + 17) * 8 / (down_kbit * 1000) * 1000
    lines += [
        f"- A full record takes {full_record_ms:.0f} ms to cross a {down_kbit:g} kbit/s link, a "
        f"1,400-byte one {small_record_ms:.1f} ms: the difference is the most small records can "
        "take off the moment a response's first bytes become usable, on a link that delivers "
        "segment by segment. Chromium hides part of it: between the response head and the first "
        "parse it commits the navigation to a renderer, which takes tens of ms here, while the "
        "first record is still arriving.",
        "- `relay` cannot show it: it delivers each read of the proxy's writes whole (up to "
        "64 KB), so the browser gets a write's records all at once, whatever their size; its "
        "figures say how the proxy's writes were cut, not what record sizes do.",
        "- Neither link emulates TCP: no slow start (on a real fresh connection an initial window "
        "of 10 segments, ~14.6 KB, does not hold a 16 KB record, so the record's last segment "
        "waits another round trip, which small records avoid), no loss (a lost segment holds "
        "back the whole record it belongs to), no queue limit. Real gains on fresh or lossy "
        "connections can be larger than measured here; on fast links they vanish.",
        "- The HTML's response head is a write of its own (an HTTP/2 HEADERS frame), so record "
        "sizing does not move `response head`: its spread between rows is noise (connection "
        "set-up on a shared 2-core machine), which `head → first bytes` leaves out.",
        "- FCP waits for the render-blocking stylesheet. reshape speaks HTTP/2 to the browser, "
        "one connection: the stylesheet's response queues behind the rest of the 300 KB HTML, "
        "which reshape has already written into the link, so reshape's FCP follows the HTML's "
        "transfer time whatever the record sizes. mitmdump mirrors the origin's ALPN "
        "(HTTP/1.1 here) and the browser fetches the stylesheet on a connection of its own, "
        "which shares the link in turns with the HTML's: that, not record sizes, is mitmdump's "
        "early FCP. It is a lead for reshape (hold back what is written to the client so that "
        "HTTP/2 priorities can act), not an effect of this issue.",
        "- mitmdump buffers each response whole before sending it (reshape streams), so its "
        "first body write is the whole page in 16 KB records.",
        "- Costs are not measured here: during the warm-up reshape writes ~750 records per MB "
        "instead of 64, each an encryption call of its own, with 17 bytes of overhead each "
        "(~1.2 %).",
    ]
    return "\n".join(lines)


def _quartiles(timings: Sequence[PageTiming], field: str) -> str:
    values = [getattr(timing, field) for timing in timings]
    if len(values) < 2:
        return ""
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:,.0f}–{high:,.0f} ms"


def _busy_machine_notes() -> list[str]:
    load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    if load < cores:
        return []
    return [
        f"- Load average {load:.2f} on {cores} cores when the run started: other work competed "
        "with the browser, the proxies and the relays; compare rows within this run only."
    ]


def _difference(row: Row, baseline: Row, field: str) -> float | None:
    own, base = row.median(field), baseline.median(field)
    return None if own is None or base is None else own - base
