"""bench/ttfb: first usable bytes and first paint over a slow link, dynamic vs 16 KB TLS
records.

Run it as `python -m bench.ttfb` (see its --help)."""
