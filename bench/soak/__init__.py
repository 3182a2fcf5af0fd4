"""bench/soak: reshape's long run under many connections: errors, memory, fds.

Run it as `python -m bench.soak` (see its --help)."""
