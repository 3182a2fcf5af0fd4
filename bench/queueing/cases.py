"""What bench/queueing compares: origins, browsers and proxy configurations, and the cases (one
of each) it runs by default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OriginKind:
    name: str
    label: str
    http2: bool  # offers h2 by ALPN (besides http/1.1)
    host: str  # nginx's own address
    relay_host: str  # where browsers and proxies reach it, through the emulated link


@dataclass(frozen=True)
class BrowserKind:
    name: str
    label: str
    http2: bool  # offers h2 by ALPN and uses it when chosen, as Chromium does


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    proxy: str | None  # "reshape", "mitmdump", or None: the browsers go to the origin themselves
    policy: str | None = None  # reshape's policy file


@dataclass(frozen=True)
class Case:
    origin: str
    browsers: str
    config: str

    @property
    def key(self) -> str:
        return f"{self.origin}/{self.browsers}/{self.config}"

    @property
    def slug(self) -> str:
        """The key as a file name."""
        return self.key.replace("/", "-")


ORIGINS = {
    o.name: o
    for o in (
        OriginKind("h1", "HTTP/1.1-only origin", False, "127.0.0.2", "127.0.0.4"),
        OriginKind("h2", "h2 origin", True, "127.0.0.3", "127.0.0.5"),
    )
}

BROWSERS = {
    b.name: b
    for b in (
        BrowserKind("alpn", "h2 by ALPN", True),
        BrowserKind("h1", "HTTP/1.1", False),
    )
}


def _pool(knobs: str) -> str:
    return f"version: 1\ndefault: pool\npolicies:\n  pool:\n    upstream: {{{knobs}}}\n"


CONFIGS = {
    c.name: c
    for c in (
        Config("direct", "direct", None),
        Config("mitmdump", "mitmdump", "mitmdump"),
        # A policy without `upstream:` gets the pool with a browser's limits (BROWSER_LIKE in
        # reshape/features/pool/routes.py): 6 per host, h2 where offered, no pipelining.
        Config(
            "pool-h2",
            "reshape {}: pool, h2 where offered",
            "reshape",
            "version: 1\ndefault: plain\npolicies:\n  plain: {}\n",
        ),
        Config(
            "pool-pipelined",
            "pool, pipeline_depth 8",
            "reshape",
            _pool("max_connections_per_host: 6, pipeline_depth: 8, http2: false"),
        ),
    )
}

# The comparison of the pipelining study, with browsers that negotiate as Chromium does, against
# an origin of its era and a current one; then the earlier HTTP/1.1-only browsers as a reference.
DEFAULT_CASES = [
    *(Case("h1", "alpn", config) for config in CONFIGS),
    *(Case("h2", "alpn", config) for config in CONFIGS),
    Case("h1", "h1", "direct"),
    Case("h1", "h1", "pool-pipelined"),
]
