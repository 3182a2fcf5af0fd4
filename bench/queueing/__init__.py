"""bench/queueing: queueing, connection reuse and latency through reshape's pool.

Run it as `python -m bench.queueing` (see its --help)."""
