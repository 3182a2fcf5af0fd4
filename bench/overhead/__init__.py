"""bench/overhead: reshape's cost as a forward proxy, beside squid and mitmdump.

Run it as `python -m bench.overhead` (see its --help)."""
