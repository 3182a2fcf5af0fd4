"""Shared lab equipment: a test PKI, real origin servers, generated sites, a browser runner.

Used by both the test suite (tests/) and the benchmarks (bench/), so that what is measured is
exactly what is tested.
"""
