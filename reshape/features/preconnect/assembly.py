"""Page loads put together from the parts several workers saw (sans-IO).

With `reshape run --workers N` a browser's connections (one CONNECT tunnel per origin) are spread
over the workers, so each sees part of a page load: the one that saw the document request and
those that adopted the navigation (navigations.py). Learning from a part alone would count the
origins other workers served as misses. So parts wait here, keyed by (client, first party,
start), until no more can come — `settle_after` seconds after the start, longer than a
navigation can last plus the time a part takes to reach the shared file — and are then combined:
resources add up, peaks add up (different workers served different connections at the same
time). A navigation no part of which saw its document is dropped: its first party is unknown.

Bounded: at most `max_parts` parts wait; beyond that the oldest are dropped.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from reshape.features.preconnect.navigations import NavigationOutcome, OriginUse

MAX_PARTS = 5000

type Key = tuple[str, str, float]


@dataclass(frozen=True)
class Learned:
    """A page load (or part of one) to learn, with the miss rule of the policy it ran under."""

    outcome: NavigationOutcome
    max_misses: int

    def to_json(self) -> dict[str, Any]:
        o = self.outcome
        return {
            "first_party": o.first_party,
            "client": o.client,
            "started": o.started,
            "ended_at": o.ended_at,
            "document": o.document,
            "max_misses": self.max_misses,
            "origins": {k: [u.resources, u.peak_in_flight] for k, u in o.origins.items()},
        }

    @classmethod
    def from_json(cls, data: Any) -> Learned:
        """ValueError (or TypeError, KeyError) if `data` is not what `to_json` wrote."""
        origins = {
            str(k): OriginUse(int(v[0]), int(v[1])) for k, v in dict(data["origins"]).items()
        }
        started, ended_at = float(data["started"]), float(data["ended_at"])
        max_misses = int(data["max_misses"])
        if not (math.isfinite(started) and math.isfinite(ended_at)) or max_misses < 1:
            raise ValueError("bad times or max_misses")
        outcome = NavigationOutcome(
            str(data["first_party"]),
            origins,
            ended_at,
            str(data["client"]),
            started,
            bool(data["document"]),
        )
        return cls(outcome, max_misses)


class NavigationParts:
    def __init__(self, max_parts: int = MAX_PARTS) -> None:
        self.max_parts = max_parts
        self._parts: list[Learned] = []  # oldest first

    def __len__(self) -> int:
        return len(self._parts)

    def add(self, part: Learned) -> None:
        self._parts.append(part)
        if len(self._parts) > self.max_parts:
            self._parts.sort(key=lambda p: p.outcome.started)
            del self._parts[: len(self._parts) - self.max_parts]

    def settled(self, now: float, settle_after: float) -> list[Learned]:
        """The navigations started `settle_after` seconds ago or earlier, each combined from its
        parts (oldest first); they leave the waiting parts."""
        groups: dict[Key, list[Learned]] = defaultdict(list)
        waiting: list[Learned] = []
        for part in self._parts:
            o = part.outcome
            if now - o.started >= settle_after:
                groups[(o.client, o.first_party, o.started)].append(part)
            else:
                waiting.append(part)
        self._parts = waiting
        combined = [_combine(parts) for _, parts in sorted(groups.items(), key=lambda g: g[0][2])]
        return [c for c in combined if c is not None]

    def to_json(self) -> list[dict[str, Any]]:
        return [part.to_json() for part in self._parts]

    @classmethod
    def from_json(cls, data: object, max_parts: int = MAX_PARTS) -> NavigationParts:
        """The parts `to_json` wrote; malformed entries are skipped (they only ever cost what
        one page load would have taught)."""
        parts = cls(max_parts)
        for item in data if isinstance(data, list) else []:
            try:
                parts.add(Learned.from_json(item))
            except (ValueError, TypeError, KeyError, IndexError):
                continue
        return parts


def _combine(parts: list[Learned]) -> Learned | None:
    documents = [p for p in parts if p.outcome.document]
    if not documents:
        return None
    first = documents[0]
    origins: dict[str, OriginUse] = {}
    for part in parts:
        for origin, use in part.outcome.origins.items():
            seen = origins.get(origin)
            origins[origin] = (
                use
                if seen is None
                else OriginUse(
                    seen.resources + use.resources, seen.peak_in_flight + use.peak_in_flight
                )
            )
    o = first.outcome
    outcome = NavigationOutcome(
        o.first_party,
        origins,
        max(p.outcome.ended_at for p in parts),
        o.client,
        o.started,
        True,
    )
    return Learned(outcome, first.max_misses)
