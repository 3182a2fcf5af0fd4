"""reshape's /metrics, read by benches: scrape, subtract the scrape before a run, sum by labels.

Only the Prometheus text format's sample lines are parsed (`name{l="v",...} value`); comments
and types are skipped. Used by bench/capacity and bench/queueing.
"""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Samples:
    """Sample values keyed by (name, sorted label pairs)."""

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    @classmethod
    def parse(cls, text: str) -> Samples:
        values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            match = _SAMPLE.match(line)
            if match is None:
                continue
            name, labels, value = match.groups()
            pairs = tuple(sorted(_LABEL.findall(labels or "")))
            values[(name, pairs)] = float(value)
        return cls(values)

    def __sub__(self, before: Samples) -> Samples:
        return Samples({k: v - before.values.get(k, 0.0) for k, v in self.values.items()})

    def sum(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(
            value
            for (sample, pairs), value in self.values.items()
            if sample == name and wanted <= set(pairs)
        )

    def bucket(self, name: str, le: float, **labels: str) -> float:
        """A histogram's cumulative count at the bucket edge `le` (which must exist)."""
        total = 0.0
        found = False
        wanted = set(labels.items())
        for (sample, pairs), value in self.values.items():
            if sample != f"{name}_bucket" or not wanted <= set(pairs):
                continue
            edge = dict(pairs).get("le")
            if edge is not None and edge != "+Inf" and float(edge) == le:
                total += value
                found = True
        if not found:
            raise KeyError(f"{name} has no bucket le={le:g}")
        return total


def scrape(admin: tuple[str, int]) -> Samples:
    """reshape's metrics from its admin endpoint (never through a proxy from the environment)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{admin[0]}:{admin[1]}/metrics", timeout=10) as response:
        return Samples.parse(response.read().decode())
