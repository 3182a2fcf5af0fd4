"""What `reshape run` was asked to do, checked once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from proxy.addresses import ListenAddress, Network
from proxy.client_errors import DEFAULT_HEADER_TIMEOUT
from proxy.policy.schema import UpstreamKnobs

# mitmproxy's own origin connections (policies without `upstream:`) get the pool's defaults.
DEFAULT_ORIGIN_CONNECT_TIMEOUT = UpstreamKnobs().connect_timeout
DEFAULT_ORIGIN_READ_TIMEOUT = UpstreamKnobs().read_timeout

DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_ADMIN = "127.0.0.1:9464"
DEFAULT_POLICY = Path("policies/default.yaml")
DEFAULT_CONFDIR = Path("~/.reshape")
DEFAULT_DRAIN_SECONDS = 10.0


@dataclass(frozen=True)
class RunConfig:
    listen: ListenAddress
    admin: ListenAddress
    policy_path: Path
    confdir: Path
    upstream_ca: Path | None
    workers: int
    drain_seconds: float
    # Client networks allowed besides loopback; required to listen beyond loopback.
    allow_clients: tuple[Network, ...] = field(default_factory=tuple)
    # Append one JSON line per completed request here (proxy/request_log.py); None: no log.
    request_log: Path | None = None
    # Proxy authentication against this users file (proxy/users.py); None: no authentication.
    users: Path | None = None
    # A client must finish each request head within this many seconds (408 and close).
    client_header_timeout: float = DEFAULT_HEADER_TIMEOUT
    # mitmproxy's own origin connections: connect (else 502) and response-head (else 504)
    # timeouts; pooled requests take theirs from their policy's `upstream:`.
    origin_connect_timeout: float = DEFAULT_ORIGIN_CONNECT_TIMEOUT
    origin_read_timeout: float = DEFAULT_ORIGIN_READ_TIMEOUT
