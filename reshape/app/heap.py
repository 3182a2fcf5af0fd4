"""The proxy process's heap once it has started: kept out of the cyclic collector's full passes.

Why: CPython's full collection (generation 2) walks every tracked object, and most of a proxy's
are its start-up's (mitmproxy's and reshape's modules, addons, the policy, the CA): measured
under bench/overhead's h2 load through the pool (20 streams, 6,000 requests, 2026-11-24), a full
pass stopped the event loop for 35-40 ms about every 3,000 requests. Frozen once the listener is
up (`gc.freeze`, which CPython documents for long-running processes after their start-up), the
same passes took ~3 ms. Objects made later (flows, connections, a reloaded policy) are collected
as before; CPython's thresholds are kept (raising them moved the collector's total time within
the run-to-run noise).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect what start-up left for the collector, then move everything that remains to the
    permanent generation, which collections never walk."""
    gc.collect()
    gc.freeze()
