"""Benchmarks and the page-load lab (see bench/README.md)."""
