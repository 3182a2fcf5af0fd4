"""bench/queueing's load: a few browsers, each loading a page of many small resources in bursts.

Each browser (bench/capacity/client.py: HTTP/1.1 with 6 connections per host, or h2 by ALPN as
Chromium negotiates it) starts at a seeded moment within the first pause, loads the page `pages`
times with a seeded pause between loads, and keeps its connections from one load to the next. A
load is one burst: the HTML, then every subresource at once. The whole run is bounded by
`timeout`; loads still going then are abandoned and count as errors.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from dataclasses import dataclass, field

from bench.capacity.client import Browser, Fetch
from bench.capacity.response import FetchError


@dataclass(frozen=True)
class LoadPlan:
    page_url: str
    sizes: dict[str, int]  # root-relative path -> body bytes
    browsers: int
    per_host: int
    pages: int  # loads per browser
    pause: tuple[float, float]  # seconds between a browser's loads, uniform
    proxy: tuple[str, int] | None
    tls: ssl.SSLContext  # offering h2 by ALPN if `http2`
    http2: bool  # the browsers negotiate h2 by ALPN, as Chromium does
    timeout: float
    seed: int


@dataclass
class LoadResult:
    fetches: list[Fetch] = field(default_factory=list)
    page_seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connections_opened: int = 0
    seconds: float = 0.0


async def run_load(plan: LoadPlan) -> LoadResult:
    loop = asyncio.get_running_loop()
    result = LoadResult()
    began = loop.time()

    async def browse(index: int) -> None:
        rng = random.Random(plan.seed * 7919 + index)
        browser = Browser(plan.per_host, proxy=plan.proxy, tls=plan.tls, http2=plan.http2)
        try:
            await asyncio.sleep(rng.uniform(0, plan.pause[1]))
            for number in range(plan.pages):
                if number:
                    await asyncio.sleep(rng.uniform(*plan.pause))
                try:
                    page = await browser.load_page(plan.page_url)
                except (FetchError, OSError, ssl.SSLError) as error:
                    result.errors.append(str(error) or type(error).__name__)
                    await browser.close()
                    continue
                wrong = page.problem(plan.sizes)
                if wrong:
                    result.errors.append(wrong)
                result.fetches.extend(page.fetches)
                result.page_seconds.append(page.seconds)
        finally:
            result.connections_opened += browser.connections_opened
            await browser.close()

    tasks = [asyncio.create_task(browse(i)) for i in range(plan.browsers)]
    _, late = await asyncio.wait(tasks, timeout=plan.timeout)
    for task in late:
        task.cancel()
        result.errors.append(f"run not finished within {plan.timeout:g} s")
    ended = await asyncio.gather(*tasks, return_exceptions=True)
    crashed = [e for e in ended if isinstance(e, Exception)]
    if crashed:
        raise crashed[0]  # a bug in the bench, not a slow server
    result.seconds = loop.time() - began
    return result
