"""Benchmarks and the page-load lab: one package per suite, each run as `python -m bench.NAME`
(capacity, lab, overhead, queueing, soak, ttfb); loadgen/ is the Go load generator they drive;
runs.py what every suite shares; results in RESULTS.md, plots in plots/."""
