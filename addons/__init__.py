"""One mitmproxy addon per reshaping behaviour."""
