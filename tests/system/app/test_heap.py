"""reshape/app/heap.py: start-up's objects frozen, its garbage collected first, later cycles still
collected. In a child process: freezing is for the whole interpreter."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import gc, weakref
from reshape.app.heap import freeze_startup_heap

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

kept = [Node() for _ in range(1000)]
garbage = cycle()              # unreachable before the freeze: must not be frozen with the rest
freeze_startup_heap()
frozen = gc.get_freeze_count()
later = cycle()                # made after the freeze: a full collection still finds it
gc.collect()
print(frozen, len(gc.get_objects()), garbage() is None, later() is None)
"""


def test_startup_objects_are_frozen_and_cycles_are_still_collected() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    frozen, tracked, garbage_collected, later_collected = result.stdout.split()
    assert int(frozen) > 1000  # the 1,000 kept nodes and start-up's own objects
    assert int(tracked) < int(frozen) // 10  # what collections still walk
    assert garbage_collected == "True"
    assert later_collected == "True"
