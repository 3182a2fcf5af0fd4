"""What the test suites share: `reshape run` as a subprocess, clients, scripted origins, a real
Prometheus. The fixtures that use them are in tests/conftest.py."""
