"""What earlier page loads taught: per first-party origin, the origins its pages need (sans-IO).

Chrome's loading predictor, as the issue describes it: for each origin a first party's page
loads needed, count hits (a load of the first party needed it) and misses (a load did not);
confidence = hits / (hits + misses); an origin missed `max_misses` loads in a row is forgotten.
Evidence fades: before a load is learned, the first party's hits and misses are halved for every
`half_life` seconds since its last load, so what the site does now outweighs what it did months
ago. Per origin it also keeps the resources a load fetched and the most requests in flight at
once (moving averages): the two rules for how many connections to open read them.

Memory is bounded: `max_first_parties` first parties (least recently learned dropped first) ×
`max_origins` origins each (the least confident dropped first).

`to_json` / `from_json` give the versioned form that `store.py` persists; `from_json` refuses
anything malformed with a ValueError.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from reshape.features.preconnect.navigations import NavigationOutcome

FORMAT_VERSION = 1
DEFAULT_HALF_LIFE = 7 * 24 * 3600.0
# Weight of the newest load in the moving averages of resources and connections.
AVERAGE_WEIGHT = 0.5
MAX_ORIGIN_LENGTH = 300

type Rule = Literal["history", "half_resources"]


@dataclass
class OriginStats:
    """One origin, as seen from one first party's page loads."""

    hits: float
    misses: float
    misses_in_a_row: int
    resources: float  # per load that needed the origin
    connections: float  # most requests in flight at once, per load that needed it

    @property
    def confidence(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total > 0 else 0.0


@dataclass(frozen=True)
class Prediction:
    origin: str
    confidence: float
    resources: float
    connections: float


@dataclass
class _FirstParty:
    updated: float
    origins: dict[str, OriginStats]


def connections_wanted(prediction: Prediction, rule: Rule, cap: int) -> int:
    """How many connections to have ready for a predicted origin, at least 1 and at most `cap`.

    history: the most requests the origin had in flight at once in earlier loads (rounded up):
    the connections an HTTP/1.1 origin needed to serve them without waiting.
    half_resources: ceil(R / 2) for R expected resources, the parallel-connection study's rule.
    """
    if cap < 1:
        raise ValueError(f"cap must be at least 1, not {cap}")
    if rule == "history":
        wanted = math.ceil(prediction.connections - 1e-9)
    else:
        wanted = math.ceil(prediction.resources / 2 - 1e-9)
    return max(1, min(wanted, cap))


class OriginTable:
    def __init__(
        self,
        *,
        max_first_parties: int = 1000,
        max_origins: int = 50,
        half_life: float = DEFAULT_HALF_LIFE,
    ) -> None:
        if max_first_parties < 1 or max_origins < 1 or not half_life > 0:
            raise ValueError("max_first_parties and max_origins >= 1, half_life > 0")
        self.max_first_parties = max_first_parties
        self.max_origins = max_origins
        self.half_life = half_life
        self._first_parties: OrderedDict[str, _FirstParty] = OrderedDict()

    def __len__(self) -> int:
        return len(self._first_parties)

    def __contains__(self, first_party: object) -> bool:
        return first_party in self._first_parties

    def origins(self, first_party: str) -> dict[str, OriginStats]:
        """What is known about `first_party` (a copy; empty if nothing)."""
        known = self._first_parties.get(first_party)
        if known is None:
            return {}
        return {o: OriginStats(**vars(s)) for o, s in known.origins.items()}

    def learn(self, outcome: NavigationOutcome, *, max_misses: int) -> None:
        """One finished page load of `outcome.first_party`: hits for what it needed, misses for
        the origins it knew and did not need."""
        if max_misses < 1:
            raise ValueError(f"max_misses must be at least 1, not {max_misses}")
        fp = self._first_parties.get(outcome.first_party)
        if fp is None:
            if not outcome.origins:
                return  # a page that needs no other origin teaches nothing worth a slot
            fp = self._first_parties[outcome.first_party] = _FirstParty(outcome.ended_at, {})
        self._first_parties.move_to_end(outcome.first_party)
        fade = 0.5 ** (max(0.0, outcome.ended_at - fp.updated) / self.half_life)
        fp.updated = max(fp.updated, outcome.ended_at)
        for origin, stats in list(fp.origins.items()):
            stats.hits *= fade
            stats.misses *= fade
            use = outcome.origins.get(origin)
            if use is None:
                stats.misses += 1
                stats.misses_in_a_row += 1
                if stats.misses_in_a_row >= max_misses:
                    del fp.origins[origin]
                continue
            stats.hits += 1
            stats.misses_in_a_row = 0
            stats.resources += AVERAGE_WEIGHT * (use.resources - stats.resources)
            stats.connections += AVERAGE_WEIGHT * (use.peak_in_flight - stats.connections)
        for origin, use in outcome.origins.items():
            if origin not in fp.origins:
                fp.origins[origin] = OriginStats(1.0, 0.0, 0, use.resources, use.peak_in_flight)
        if len(fp.origins) > self.max_origins:
            ranked = sorted(fp.origins.items(), key=lambda item: (item[1].confidence, item[1].hits))
            for origin, _ in ranked[: len(fp.origins) - self.max_origins]:
                del fp.origins[origin]
        if not fp.origins:
            del self._first_parties[outcome.first_party]
        while len(self._first_parties) > self.max_first_parties:
            self._first_parties.popitem(last=False)

    def predict(self, first_party: str, *, min_confidence: float) -> list[Prediction]:
        """The origins a load of `first_party` is expected to need: confidence above
        `min_confidence`, most resources first."""
        fp = self._first_parties.get(first_party)
        if fp is None:
            return []
        predictions = [
            Prediction(origin, s.confidence, s.resources, s.connections)
            for origin, s in fp.origins.items()
            if s.confidence > min_confidence
        ]
        return sorted(predictions, key=lambda p: (-p.resources, p.origin))

    # persistence

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "first_parties": [
                {
                    "origin": name,
                    "updated": fp.updated,
                    "origins": [{"origin": o, **vars(s)} for o, s in fp.origins.items()],
                }
                for name, fp in self._first_parties.items()
            ],
        }

    @classmethod
    def from_json(
        cls,
        data: object,
        *,
        max_first_parties: int = 1000,
        max_origins: int = 50,
        half_life: float = DEFAULT_HALF_LIFE,
    ) -> OriginTable:
        """The table `to_json` wrote; ValueError if `data` is not one (limits apply: a file
        written with larger limits is cut down, least recent and least confident first)."""
        table = cls(
            max_first_parties=max_first_parties, max_origins=max_origins, half_life=half_life
        )
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {data.get('version')!r}, expected {FORMAT_VERSION}")
        first_parties = data.get("first_parties")
        if not isinstance(first_parties, list):
            raise ValueError("first_parties is not a list")
        for entry in first_parties:
            name = _origin(entry, "first party")
            origins: dict[str, OriginStats] = {}
            listed = entry.get("origins")
            if not isinstance(listed, list):
                raise ValueError(f"{name}: origins is not a list")
            for item in listed:
                origin = _origin(item, f"{name}: origin")
                origins[origin] = OriginStats(
                    hits=_number(item, "hits", origin),
                    misses=_number(item, "misses", origin),
                    misses_in_a_row=int(_number(item, "misses_in_a_row", origin)),
                    resources=_number(item, "resources", origin),
                    connections=_number(item, "connections", origin),
                )
            ranked = sorted(origins.items(), key=lambda i: (-i[1].confidence, -i[1].hits))
            table._first_parties[name] = _FirstParty(
                _number(entry, "updated", name), dict(ranked[:max_origins])
            )
            table._first_parties.move_to_end(name)
        while len(table._first_parties) > max_first_parties:
            table._first_parties.popitem(last=False)
        return table


def _origin(entry: object, what: str) -> str:
    if not isinstance(entry, dict):
        raise ValueError(f"{what} is not a JSON object")
    origin = entry.get("origin")
    if not isinstance(origin, str) or not 0 < len(origin) <= MAX_ORIGIN_LENGTH:
        raise ValueError(f"{what} has no valid origin")
    return origin


def _number(entry: dict[str, Any], name: str, where: str) -> float:
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: {name} is not a finite number")
    if value < 0:
        raise ValueError(f"{where}: {name} is negative")
    return float(value)
