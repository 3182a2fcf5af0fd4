"""bench/lab: page-load experiments with headless Chromium over emulated links.

Run it as `python -m bench.lab` (see its --help)."""
