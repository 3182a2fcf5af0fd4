"""TableStore: the learned table in a file, merged by several processes at once."""

from __future__ import annotations

import math
import multiprocessing
from pathlib import Path

from reshape.features.preconnect.store import TableStore
from tests.unit.features.preconnect.test_store import CDN, F, learned


def _worker(path: str, worker: int, loads: int) -> None:
    store = TableStore(Path(path), half_life=math.inf)
    for n in range(loads):
        store.merge([learned(float(worker * 1000 + n), CDN)])


def test_concurrent_merges_learn_every_load_once(tmp_path: Path) -> None:
    path = tmp_path / "preconnect.json"
    workers, loads = 4, 25
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker, args=(str(path), w, loads)) for w in range(workers)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(60)
        assert p.exitcode == 0
    stats = TableStore(path, half_life=math.inf).load().origins(F)[CDN]
    # With an infinite half-life nothing fades: every load counts one hit exactly.
    assert stats.hits == workers * loads
