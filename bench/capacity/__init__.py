"""bench/capacity: users a prefork Apache serves at 2 vs 6 connections each.

Run it as `python -m bench.capacity` (see its --help)."""
