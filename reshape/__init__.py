"""reshape's core: command line, configuration, policies, admin endpoint, process start-up."""

__version__ = "0.1.0"
