"""bench/loadgen: the Go load generator (main.go), and runner.py that builds and runs it."""
