"""What `reshape run` was asked to do, checked once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from reshape.app.logs import LogFormat
from reshape.base.addresses import ListenAddress, Network
from reshape.features.client_errors.rules import (
    DEFAULT_CLIENT_IDLE_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
)
from reshape.policy.schema import UpstreamKnobs

# mitmproxy's own origin connections (policies without `upstream:`) get the pool's defaults.
DEFAULT_ORIGIN_CONNECT_TIMEOUT = UpstreamKnobs().connect_timeout
DEFAULT_ORIGIN_READ_TIMEOUT = UpstreamKnobs().read_timeout

# More proxy processes than this is a typo: each holds ~90 MB and pools of its own, and they
# start one after another (~1.5 s each).
MAX_WORKERS = 64

DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_ADMIN = "127.0.0.1:9464"
# The policy shipped inside the package: `reshape run` works from any directory.
DEFAULT_POLICY = Path(str(resources.files("reshape.policy") / "default.yaml"))
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
    # Append one JSON line per completed request here (reshape/features/request_log/addon.py); None:
    # no log.
    request_log: Path | None = None
    # Proxy authentication against this users file (reshape/features/proxy_auth/users.py); None: no
    # authentication.
    users: Path | None = None
    # A client must finish each request head within this many seconds (408 and close).
    client_header_timeout: float = DEFAULT_HEADER_TIMEOUT
    # An exchange whose client neither sends nor takes anything this long ends.
    client_idle_timeout: float = DEFAULT_CLIENT_IDLE_TIMEOUT
    # mitmproxy's own origin connections: connect (else 502) and response-head (else 504)
    # timeouts; pooled requests take theirs from their policy's `upstream:`.
    origin_connect_timeout: float = DEFAULT_ORIGIN_CONNECT_TIMEOUT
    origin_read_timeout: float = DEFAULT_ORIGIN_READ_TIMEOUT
    # The process log (reshape/app/logs.py): threshold, format, and whether every completed
    # request is logged (else only failures and start-up facts).
    log_level: str = "info"
    log_format: LogFormat = "text"
    log_requests: bool = False
