"""The lab's network: origins behind emulated links, and the proxies under test behind theirs.

```
                 client link (relay)              origin link (one relay per origin host)
 Chromium ──▶ 127.0.0.1:R ──▶ proxy 127.0.0.1:P ──▶ 127.0.0.N:R' ──▶ origin 127.0.0.N:O
 Chromium ──────────────────── direct ────────────▶ 127.0.0.N:R' ──▶ origin 127.0.0.N:O
```

Pages name the origin relays' addresses, so every request to an origin crosses its relay. A
direct load has no proxy, so its origin relays carry the client link and the origin link chained
(delays added, the lower rate). The runner decides when relays close the connections they relay
(bench/lab/runner.py): after every load (each load then starts with no connection anywhere, in
the proxy's pool included), or only when the network setting changes (a gateway's pool stays
warm across its users). Origins keep idle connections 65 s (nginx's `keepalive_timeout` in
labkit/origins.py, and hypercorn set to the same).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.lab.sites import HOSTS, Page, build_pages
from bench.overhead import peers
from labkit.origins import Origin, hypercorn_origin, nginx_origin
from labkit.pki import OriginPKI
from labkit.relay import Link, Relay, RelayThread

# How long origins keep an idle connection: nginx's keepalive_timeout in labkit.origins, so that
# the hypercorn origin (whose own default is 5 s) keeps a gateway's pooled connections as long.
ORIGIN_KEEPALIVE_SECONDS = 65.0


@dataclass(frozen=True)
class Config:
    """One way of loading a page: directly, or through a proxy."""

    name: str
    kind: str  # "direct", "mitmdump", "reshape" or "engine-floor" (bench/lab/engine_floor.py)
    policy: Path | None = None  # reshape's (or the engine floor's) policy file
    label: str = ""
    workers: int = 1  # reshape's --workers

    @property
    def title(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class Links:
    """The emulated links of one network setting."""

    client: Link  # browser ↔ proxy
    origin: Link  # proxy ↔ each origin

    @property
    def direct(self) -> Link:
        """Browser ↔ origin with no proxy: both links one after the other."""
        return chain(self.client, self.origin)


def rtt_link(rtt_ms: float, **rates: float | None) -> Link:
    """A link of `rtt_ms` round trip, half each way, whose TCP handshake costs one round trip."""
    seconds = rtt_ms / 1000
    return Link(up_delay=seconds / 2, down_delay=seconds / 2, connect_delay=seconds, **rates)


def chain(first: Link, second: Link) -> Link:
    """Two links one after the other: delays add, rates are the lower of the two."""
    return Link(
        up_delay=first.up_delay + second.up_delay,
        down_delay=first.down_delay + second.down_delay,
        up_rate=_lower(first.up_rate, second.up_rate),
        down_rate=_lower(first.down_rate, second.down_rate),
        connect_delay=first.connect_delay + second.connect_delay,
        shared_up_rate=_lower(first.shared_up_rate, second.shared_up_rate),
        shared_down_rate=_lower(first.shared_down_rate, second.shared_down_rate),
    )


def describe(link: Link) -> str:
    """A short human description, e.g. 'RTT 100 ms, 1.25 MB/s per connection'."""
    parts = [f"RTT {(link.up_delay + link.down_delay) * 1000:g} ms"]
    if link.connect_delay:
        parts.append(f"connect {link.connect_delay * 1000:g} ms")
    if link.down_rate:
        parts.append(f"{_mbit(link.down_rate)} down per connection")
    if link.up_rate:
        parts.append(f"{_mbit(link.up_rate)} up per connection")
    if link.shared_down_rate:
        parts.append(f"{_mbit(link.shared_down_rate)} down shared")
    if link.shared_up_rate:
        parts.append(f"{_mbit(link.shared_up_rate)} up shared")
    return ", ".join(parts)


@dataclass
class OriginHost:
    name: str
    origin: Origin
    relay: Relay

    @property
    def base_url(self) -> str:
        return f"https://{self.origin.host}:{self.relay.port}"


@dataclass
class Endpoint:
    """How the browser reaches the web under one config."""

    config: Config
    proxy: peers.RunningProxy | None
    relay: Relay | None  # in front of the proxy

    @property
    def proxy_address(self) -> str | None:
        return None if self.relay is None else f"127.0.0.1:{self.relay.port}"


class Network:
    """Origins (per variant), proxies and relays, all stopped when the context ends."""

    def __init__(self, workdir: Path, relays: RelayThread, stack: ExitStack) -> None:
        self.workdir = workdir
        self.relays = relays
        self._stack = stack
        self.pki = OriginPKI(workdir / "pki")
        self.hosts: dict[str, dict[str, OriginHost]] = {}  # variant -> host name -> host
        self.pages: dict[str, dict[str, Page]] = {}  # variant -> page name -> page
        self.endpoints: dict[str, Endpoint] = {}
        self._roots = {host: workdir / "www" / host for host in HOSTS}
        self._certs = {host: self.pki.issue([address]) for host, (address, _) in HOSTS.items()}

    def start_origins(self, variant: str, hosts: list[str], pages: tuple[str, ...]) -> None:
        """Starts `hosts` for `variant` (h1: HTTP/1.1 only; h2: h2 offered) and writes `pages`."""
        started: dict[str, OriginHost] = {}
        for host in hosts:
            address, server = HOSTS[host]
            root = self._roots[host]
            root.mkdir(parents=True, exist_ok=True)
            workdir = self.workdir / "origins" / f"{variant}-{host}"
            options = {"tls": self._certs[host], "http2": variant == "h2", "workdir": workdir}
            if server == "hypercorn":
                origin = self._stack.enter_context(
                    hypercorn_origin(
                        root, address, keep_alive_timeout=ORIGIN_KEEPALIVE_SECONDS, **options
                    )
                )
            else:
                origin = self._stack.enter_context(nginx_origin(root, address, **options))
            relay = self.relays.add(address, (address, origin.port))
            started[host] = OriginHost(host, origin, relay)
        self.hosts[variant] = started
        bases = {name: host.base_url for name, host in started.items()}
        self.pages[variant] = build_pages(self._roots, bases, variant, pages)

    def start_proxy(self, config: Config, client_link: Link) -> None:
        if config.kind == "direct":
            self.endpoints[config.name] = Endpoint(config, None, None)
            return
        workdir = self.workdir / "proxies" / config.name
        workdir.mkdir(parents=True)
        ca = self.pki.ca_cert_path
        if config.kind == "mitmdump":
            running = self._stack.enter_context(peers.mitmdump(workdir, ca))
        elif config.kind == "reshape":
            assert config.policy is not None, config
            running = self._stack.enter_context(
                peers.reshape(workdir, ca, config.policy.resolve(), config.workers)
            )
        elif config.kind == "engine-floor":
            assert config.policy is not None, config
            running = self._stack.enter_context(
                peers.engine_floor(workdir, ca, config.policy.resolve())
            )
        else:
            raise ValueError(f"unknown config kind {config.kind!r}")
        relay = self.relays.add("127.0.0.1", ("127.0.0.1", running.ports[0]), client_link)
        self.endpoints[config.name] = Endpoint(config, running, relay)

    def origin_relays(self) -> list[Relay]:
        return [host.relay for hosts in self.hosts.values() for host in hosts.values()]

    def set_links(self, links: Links, config: Config) -> None:
        """Puts `links` on every relay for a load under `config` (new connections take them)."""
        origin = links.direct if config.kind == "direct" else links.origin
        for relay in self.origin_relays():
            relay.link = origin
        for endpoint in self.endpoints.values():
            if endpoint.relay is not None:
                endpoint.relay.link = links.client

    def close_connections(self) -> None:
        self.relays.close_connections()

    def reset_counters(self) -> None:
        for relay in self.relays.relays:
            relay.stats.reset()


@contextlib.contextmanager
def network(workdir: Path, relays: RelayThread) -> Iterator[Network]:
    with ExitStack() as stack:
        yield Network(workdir, relays, stack)


def policy_file(directory: Path, name: str, upstream: dict[str, object] | None) -> Path:
    """A one-policy file for reshape: plain proxying, or the shared pool with `upstream` knobs."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    knobs = "{}" if upstream is None else "{upstream: {" + _flow(upstream) + "}}"
    path.write_text(
        f"# Generated by bench/lab for config {name}.\n"
        f"version: 1\ndefault: {name}\npolicies:\n  {name}: {knobs}\n"
    )
    return path


def _flow(knobs: dict[str, object]) -> str:
    return ", ".join(
        f"{key}: {str(value).lower() if isinstance(value, bool) else value}"
        for key, value in knobs.items()
    )


def _lower(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _mbit(rate: float) -> str:
    return f"{rate * 8 / 1e6:g} Mbit/s"
