"""The bounded search for a capacity: the most concurrent users for which a step meets its goal.

Pure bookkeeping, told each step's verdict: double the user count from `start` until a step
fails (or `limit` passes), then bisect between the largest passing and the smallest failing
count. At most `max_steps` steps; a search cut short reports a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CapacitySearch:
    start: int
    limit: int
    max_steps: int
    verdicts: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.limit or self.max_steps < 1:
            raise ValueError("need 1 <= start <= limit and max_steps >= 1")

    @property
    def capacity(self) -> int:
        """The largest user count that passed (0 if none did)."""
        return max((users for users, ok in self.verdicts.items() if ok), default=0)

    @property
    def ceiling(self) -> int | None:
        """The smallest failing user count above the capacity, if one was seen."""
        return min(
            (u for u, ok in self.verdicts.items() if not ok and u > self.capacity), default=None
        )

    @property
    def exact(self) -> bool:
        """Whether capacity + 1 failed (else the capacity is only a lower bound)."""
        return self.ceiling == self.capacity + 1

    def label(self) -> str:
        if self.capacity == self.limit:
            return f">= {self.limit} (limit)"
        return str(self.capacity) if self.exact else f">= {self.capacity}"

    def next_users(self) -> int | None:
        """How many users the next step runs, or None when the search is over."""
        if len(self.verdicts) >= self.max_steps:
            return None
        low, high = self.capacity, self.ceiling
        if not self.verdicts:
            return self.start
        if high is None:
            following = min(max(1, low * 2), self.limit)
            return None if following == low or following in self.verdicts else following
        if high - low <= 1:
            return None
        return (low + high) // 2

    def record(self, users: int, passed: bool) -> None:
        self.verdicts[users] = passed
