"""The lab's experiments: which pages, origins, configurations and links each one varies.

`plt`: load time of the six pages direct, through plain mitmdump and through reshape (default
and pooled policies), at emulated RTT 0, 50, 100 and 200 ms between proxy and origins, on
HTTP/1.1-only and on h2 origins.

`booster`: the parallel-connection sweep. The four parallel-connection pages on HTTP/1.1 origins
behind a slow link, through reshape with a per-host cap of N = 1 … R connections (R: the
page's resources on its one resource host), against the rule N = R/2, the browser's own 6
(direct, and through mitmdump, which mirrors the browser's connections) and reshape's default.

`preconnect`: load time of the news page through reshape's pool with preconnect off, static and
learned (bench/lab/preconnect.py), at RTT 0, 50, 100 and 200 ms between proxy and origins.

`gateway`: reshape as a gateway near its users, its pool warm across users (bench/lab/gateway.py):
the news-6 and app pages, direct, mitmdump, reshape `{}`, pooled, pooled with learned preconnect,
pooled with two workers and the engine floor (bench/lab/engine_floor.py), at RTT 50, 100 and
200 ms between proxy and origins, h1 and h2 origins; proxy CPU per load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.lab.gateway import POOLED as GATEWAY_PROFILED
from bench.lab.gateway import gateway_configs
from bench.lab.network import Config, Links, policy_file, rtt_link
from bench.lab.preconnect import preconnect_configs
from bench.lab.runner import Cell
from bench.lab.sites import GATEWAY_PAGES, PAGES, PARALLEL_PAGES, VARIANTS, Page
from labkit.relay import Link

REPO = Path(__file__).resolve().parents[2]
DIRECT = Config("direct", "direct", label="direct")
MITMDUMP = Config("mitmdump", "mitmdump", label="mitmdump")
RESHAPE = Config(
    "reshape",
    "reshape",
    REPO / "reshape" / "policy" / "default.yaml",
    label="reshape (default.yaml)",
)
POOLED = Config(
    "reshape-pooled", "reshape", REPO / "policies" / "pooled.yaml", label="reshape (pooled.yaml)"
)
PLT_RTTS_MS = (0, 50, 100, 200)
GATEWAY_RTTS_MS = (50, 100, 200)
# The booster's link to origins: long enough that connection set-up and request round trips
# matter, and slow enough that parallel connections matter for bytes: each connection gets at
# most 10 Mbit/s (as a window-limited TCP flow would), all together at most 40 Mbit/s per origin.
BOOSTER_RTT_MS = 100
BOOSTER_PER_CONNECTION = 10e6 / 8  # bytes/s
BOOSTER_SHARED = 40e6 / 8
RESOURCE_HOST = "img"  # where the parallel-connection pages keep all their resources
DEFAULT_REPS = 5
# The gateway's targets are ratios of medians at one RTT: 7 loads give a median interval of
# 2nd–6th smallest at 87.5% (min–max at 98.4%).
GATEWAY_REPS = 7


class UnknownConfigError(ValueError):
    """A part of an experiment names a configuration the experiment does not have."""


@dataclass(frozen=True)
class Experiment:
    name: str
    summary: str
    pages: tuple[str, ...]
    variants: tuple[str, ...]
    links: dict[str, Links]
    reps: int
    quick: bool = False
    # Connections live across loads (a gateway's pool warm across users; runner.run_warm_loads)
    # instead of every load starting cold.
    warm: bool = False
    profiled: str | None = None  # the config whose proxy --profile records
    only_configs: tuple[str, ...] = ()  # a part of the experiment: only these configs

    @property
    def is_booster(self) -> bool:
        return self.name == "booster"

    def configs(self, workdir: Path, pages: dict[str, dict[str, Page]]) -> list[Config]:
        """Every configuration some cell needs (policy files for caps go to `workdir`), or
        those of `only_configs`; UnknownConfigError if it names one the experiment lacks."""
        configs = self._all_configs(workdir, pages)
        names = [c.name for c in configs]
        unknown = [name for name in self.only_configs if name not in names]
        if unknown:
            raise UnknownConfigError(
                f"{self.name} has no configuration {', '.join(unknown)} (it has {', '.join(names)})"
            )
        return [c for c in configs if c.name in self.only_configs] if self.only_configs else configs

    def _all_configs(self, workdir: Path, pages: dict[str, dict[str, Page]]) -> list[Config]:
        if self.name == "preconnect":
            return preconnect_configs(workdir)
        if self.name == "gateway":
            return gateway_configs(workdir)
        if not self.is_booster:
            return [DIRECT, MITMDUMP, RESHAPE, POOLED]
        caps = sorted(
            {
                n
                for by_page in pages.values()
                for p in by_page.values()
                for n in _caps(p, self.quick)
            }
        )
        references = [DIRECT, RESHAPE] if self.quick else [DIRECT, MITMDUMP, RESHAPE]
        return references + [cap_config(workdir, n) for n in caps]

    def cells(self, pages: dict[str, dict[str, Page]], configs: list[Config]) -> list[Cell]:
        """The cells of one repetition, configurations alternating innermost (A B C A B C …)."""
        cells = []
        for link in self.links:
            for variant in self.variants:
                for name in self.pages:
                    page = pages[variant][name]
                    wanted = [c.name for c in configs if not c.name.startswith("cap-")]
                    if self.is_booster:
                        wanted += [f"cap-{n}" for n in _caps(page, self.quick)]
                    cells += [Cell(variant, name, config, link) for config in wanted]
        return cells


def cap_config(workdir: Path, cap: int) -> Config:
    policy = policy_file(workdir / "policies", f"cap{cap}", {"max_connections_per_host": cap})
    return Config(f"cap-{cap}", "reshape", policy, label=f"reshape, cap {cap}")


def resources_per_host(page: Page) -> int:
    """R: the page's subresources on its resource host."""
    return page.per_host.get(RESOURCE_HOST, 0)


def _caps(page: Page, quick: bool) -> list[int]:
    r = resources_per_host(page)
    if quick:
        return sorted({1, max(1, r // 2), r})
    return list(range(1, r + 1))


def experiment(name: str, *, quick: bool = False) -> Experiment:
    if name == "plt":
        rtts = (50,) if quick else PLT_RTTS_MS
        return Experiment(
            "plt",
            "load time of the six pages: direct, mitmdump, reshape default and pooled, "
            "RTT 0/50/100/200 ms between proxy and origins, h1 and h2 origins",
            PAGES,
            ("h2",) if quick else VARIANTS,
            {f"{rtt} ms": Links(Link(), rtt_link(rtt)) for rtt in rtts},
            1 if quick else DEFAULT_REPS,
            quick,
        )
    if name == "booster":
        link = rtt_link(
            BOOSTER_RTT_MS,
            down_rate=BOOSTER_PER_CONNECTION,
            shared_down_rate=BOOSTER_SHARED,
        )
        return Experiment(
            "booster",
            "parallel-connection sweep: reshape's per-host cap N = 1 … R on the four "
            "parallel-connection pages (h1 origins, RTT 100 ms, 10 Mbit/s per connection, "
            "40 Mbit/s per origin), against N = R/2 and the browser's own 6",
            ("css-and-images",) if quick else PARALLEL_PAGES,
            ("h1",),
            {f"{BOOSTER_RTT_MS} ms": Links(Link(), link)},
            1 if quick else DEFAULT_REPS,
            quick,
        )
    if name == "preconnect":
        rtts = (50,) if quick else PLT_RTTS_MS
        return Experiment(
            "preconnect",
            "load time of the news page through reshape's pool with preconnect off, static "
            "(2 connections per origin on first sight) and learned, RTT 0/50/100/200 ms between "
            "proxy and origins, h1 and h2 origins; origin connections and preconnects used and "
            "wasted",
            ("news",),
            ("h1",) if quick else VARIANTS,
            {f"{rtt} ms": Links(Link(), rtt_link(rtt)) for rtt in rtts},
            1 if quick else DEFAULT_REPS,
            quick,
        )
    if name == "gateway":
        gateway_rtts = (50,) if quick else GATEWAY_RTTS_MS
        return Experiment(
            "gateway",
            "a gateway near its users, its pool warm across users: the news-6 and app pages, "
            "every load a new user (fresh browser context), direct, mitmdump, reshape {}, "
            "pooled, pooled with learned preconnect, pooled with learned early hints, pooled "
            "with 2 workers, the engine floor (the pool behind a minimal front end), RTT "
            "50/100/200 ms between proxy and origins, h1 and h2 origins; proxy CPU per load",
            GATEWAY_PAGES,
            ("h1",) if quick else VARIANTS,
            {f"{rtt} ms": Links(Link(), rtt_link(rtt)) for rtt in gateway_rtts},
            1 if quick else GATEWAY_REPS,
            quick,
            warm=True,
            profiled=GATEWAY_PROFILED,
        )
    raise KeyError(name)


NAMES = ("plt", "booster", "preconnect", "gateway")
