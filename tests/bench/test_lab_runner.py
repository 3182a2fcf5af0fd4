"""bench/lab/runner.py: the order of a warm group's unrecorded loads."""

from __future__ import annotations

from bench.lab.runner import Cell, warm_up_loads, warm_up_order

CONFIGS = ("direct", "mitmdump", "reshape", "reshape-pooled", "pooled-hints", "pooled-w2")


def test_every_pool_idles_as_long_before_its_first_recorded_load_as_between_two() -> None:
    group = [Cell("h1", "app", config, "200 ms") for config in CONFIGS]
    workers = {"pooled-w2": 2}
    order = warm_up_order(group, lambda cell: workers.get(cell.config, 1))
    assert len(order) == len(CONFIGS) - 1 + warm_up_loads(2)
    assert sum(cell.config == "pooled-w2" for cell in order) == warm_up_loads(2)
    loads = [*order, *group]  # the warm-ups, then the first repetition
    for cell in group:
        last_warm_up = len(order) - 1 - order[::-1].index(cell)
        first_recorded = len(order) + group.index(cell)
        assert first_recorded - last_warm_up - 1 == len(group) - 1, cell.config
        assert loads[first_recorded] == cell
