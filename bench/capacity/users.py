"""Simulated users for bench/capacity: each loads a page, thinks, and loads it again.

One step runs `users` users at once for a fixed time: starts spread over the first think time,
a warm-up whose pages are not counted, then a measured window. A user is one `Browser` with
`per_host` keep-alive connections, kept across its pages as a browser keeps them. A page load
is the HTML, then all its subresources at once; it counts as good when every response is a 200
of the right size and it ends within the goal. A load that takes longer than `page_timeout` is
abandoned (its connections closed) and counts as failed. Every loop is bounded in time: the
step ends at most `page_timeout` after its window.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import resource
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.capacity.client import Browser
from bench.capacity.procs import own_runqueue_seconds
from bench.capacity.response import FetchError


@dataclass(frozen=True)
class StepPlan:
    users: int
    per_host: int
    page_url: str
    sizes: dict[str, int]  # root-relative path -> body bytes, to check every response
    proxy: tuple[str, int] | None
    warmup: float
    duration: float
    think: tuple[float, float]  # seconds, uniform
    page_timeout: float
    goal: float  # a good page loads within this many seconds
    seed: int


@dataclass(frozen=True)
class PageOutcome:
    started: float  # seconds since the step began
    seconds: float  # math.inf when abandoned
    error: str | None
    timed_out: bool  # abandoned after the page timeout (an error too)
    requests: int
    retried: int


@dataclass
class StepResult:
    plan: StepPlan
    pages: list[PageOutcome] = field(default_factory=list)  # those started in the window
    connections_opened: int = 0
    window_seconds: float = 0.0
    # What the probes measured over the window (e.g. CPU seconds of each process group).
    probes: dict[str, float] = field(default_factory=dict)

    @property
    def good(self) -> int:
        return sum(1 for p in self.pages if p.error is None and p.seconds <= self.plan.goal)

    @property
    def good_share(self) -> float:
        return self.good / len(self.pages) if self.pages else 0.0

    @property
    def timeouts(self) -> int:
        return sum(1 for p in self.pages if p.timed_out)

    @property
    def errors(self) -> int:
        """Pages that failed other than by taking too long: never expected."""
        return sum(1 for p in self.pages if p.error is not None and not p.timed_out)

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.pages)

    def percentile(self, q: float) -> float:
        """Page load time at quantile q (nearest rank); failed pages count as infinitely slow."""
        times = sorted(p.seconds if p.error is None else math.inf for p in self.pages)
        if not times:
            return math.inf
        return times[min(len(times) - 1, max(0, math.ceil(q * len(times)) - 1))]

    def error_samples(self) -> list[str]:
        return sorted({p.error for p in self.pages if p.error and not p.timed_out})[:3]


async def run_step(plan: StepPlan, probe: Callable[[], dict[str, float]] = dict) -> StepResult:
    """Runs one step; `probe()` is read at the start and the end of the window (differences)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    window_start = began + plan.warmup
    window_end = window_start + plan.duration
    result = StepResult(plan)
    browsers: list[Browser] = []

    async def user(index: int) -> None:
        rng = random.Random(plan.seed * 100_003 + index)
        browser = Browser(plan.per_host, proxy=plan.proxy)
        browsers.append(browser)
        await asyncio.sleep(rng.uniform(0, plan.think[1]))
        while (started := loop.time()) < window_end:
            error: str | None = None
            timed_out = False
            requests = retried = 0
            try:
                page = await asyncio.wait_for(browser.load_page(plan.page_url), plan.page_timeout)
            except TimeoutError:
                seconds, error = math.inf, f"no load within {plan.page_timeout:g} s"
                timed_out = True
                await browser.close()
            except (FetchError, OSError) as failure:
                seconds, error = loop.time() - started, str(failure) or type(failure).__name__
                await browser.close()
            else:
                seconds = page.seconds
                error = page.problem(plan.sizes)
                requests = len(page.fetches)
                retried = sum(1 for f in page.fetches if f.retried)
            if started >= window_start:
                result.pages.append(
                    PageOutcome(started - began, seconds, error, timed_out, requests, retried)
                )
            think = rng.uniform(*plan.think)
            await asyncio.sleep(max(0.0, min(think, window_end - loop.time())))

    async def window_probe() -> dict[str, float]:
        await asyncio.sleep(max(0.0, window_start - loop.time()))
        before = _with_own_cpu(probe())
        await asyncio.sleep(max(0.0, window_end - loop.time()))
        after = _with_own_cpu(probe())
        return {key: after[key] - before.get(key, 0.0) for key in after}

    probing = asyncio.create_task(window_probe())
    try:
        tasks = [asyncio.create_task(user(i)) for i in range(plan.users)]
        # Users end within a page timeout (plus a think time cut short) after the window.
        _, late = await asyncio.wait(
            tasks, timeout=plan.warmup + plan.duration + plan.page_timeout + 5
        )
        for task in late:
            task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        crashed = [e for e in ended if isinstance(e, Exception)]
        if crashed:
            raise crashed[0]  # a bug in the bench, not a slow server
        result.probes = await probing
    finally:
        probing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probing
        for browser in browsers:
            await browser.close()
    result.connections_opened = sum(b.connections_opened for b in browsers)
    result.window_seconds = plan.duration
    return result


def _with_own_cpu(values: dict[str, float]) -> dict[str, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        **values,
        "client": usage.ru_utime + usage.ru_stime,
        "client_wait": own_runqueue_seconds(),
    }
