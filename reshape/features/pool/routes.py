"""Where a request goes through the engine, and under which limits: its `Route`.

Sans-IO: from a destination (scheme, host, port, TLS name) and the policy a request runs under,
the engine's `Route`. A policy without an `upstream:` section gets the pool with the limits a
browser keeps for itself, per client (`BROWSER_LIKE`: 6 connections per origin and client, HTTP/2
where offered, no pipelining).
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from reshape.features.destinations.rules import OwnAddressBook, PeerRules
from reshape.features.tls_records.rules import SizedRecords
from reshape.policy.schema import Policy, UpstreamKnobs
from reshape.upstream.engine import Route
from reshape.upstream.pool import PoolKey, PoolLimits

# The knobs of a policy without `upstream:`: each client as a browser on its own (6 connections
# per origin, no pipelining), sharing the idle connections, at most 256 per origin in all (as
# Chromium's 256 sockets per profile).
BROWSER_LIKE = UpstreamKnobs(max_connections_per_host=256, max_connections_per_client=6)


@dataclass(frozen=True)
class Destination:
    """Where a request's connection goes."""

    scheme: str  # "http" | "https"
    host: str
    port: int
    sni: str | None  # the TLS server name (https only)

    @classmethod
    def of(cls, scheme: str, host: str, port: int, client_sni: str | None = None) -> Destination:
        """The destination of a request to `host`; `client_sni` is the name the client itself
        sent in its TLS hello (if it tunnelled), which names the server even when `host` is an
        address.

        A host name's case is no part of it (RFC 9110 §4.2.3): `Origin.Example` and
        `origin.example` share one pool and its per-host cap, which another case of the name
        got round. A TLS server name goes without a trailing dot (RFC 6066 §3); the host keeps
        it (`intranet.` names no other host than the resolver's search list may make of
        `intranet`)."""
        host = host.lower()
        if scheme != "https":
            return cls(scheme, host, port, None)
        sni = client_sni or (None if _is_ip(host) else host)
        if sni:
            sni = sni.lower().rstrip(".") or None
        return cls(scheme, host, port, sni)

    @classmethod
    def of_origin(cls, origin: str) -> Destination | None:
        """The destination of an origin written as a URL with its port (`https://host:443`, as
        the preconnect table stores them); None if it is not one."""
        try:
            parts = urlsplit(origin)
            port = parts.port
        except ValueError:
            return None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            return None
        return cls.of(parts.scheme, parts.hostname, port)


def knobs_of(policy: Policy, defaults: UpstreamKnobs = BROWSER_LIKE) -> UpstreamKnobs:
    return policy.upstream if policy.upstream is not None else defaults


def limits_of(knobs: UpstreamKnobs) -> PoolLimits:
    return PoolLimits(
        max_connections=knobs.max_connections_per_host,
        max_queue=knobs.max_queue,
        queue_timeout=knobs.queue_timeout,
        idle_timeout=knobs.idle_timeout,
        pipeline_depth=knobs.pipeline_depth,
        http2=knobs.http2,
        per_client=knobs.max_connections_per_client,
    )


def route(
    destination: Destination,
    policy: Policy,
    policy_name: str,
    arm: str,
    *,
    client: str | None = None,
    client_address: str | None = None,
    defaults: UpstreamKnobs = BROWSER_LIKE,
    own: OwnAddressBook | None = None,
) -> Route:
    """The route of a request from the client connection `client` (its id) at
    `client_address` (who counts as one client for `max_connections_per_client`), under `policy`;
    `defaults` are the knobs of a policy without `upstream:`; `own`, the proxy's addresses,
    which its connections never reach (None: no check of the connected peer)."""
    knobs = knobs_of(policy, defaults)
    records = policy.tls_records
    sized = records is not None and records.side == "both" and records.mode != "off"
    return Route(
        key=PoolKey(destination.scheme, destination.host, destination.port, destination.sni),
        limits=limits_of(knobs),
        connect_timeout=knobs.connect_timeout,
        read_timeout=knobs.read_timeout,
        pipeline_stall_timeout=knobs.pipeline_stall_timeout,
        policy=policy_name,
        arm=arm,
        peer_check=PeerRules(policy.destinations, own) if own is not None else None,
        records=SizedRecords(records) if sized and records is not None else None,
        owner=None if knobs.share else client,
        client=client_address if knobs.max_connections_per_client else None,
    )


def pinned_route(route: Route, client: str) -> Route:
    """`route` for the client connection `client` once an origin authenticates its connection
    (reshape/features/pool/connection_auth.py): a pool of its own, of one HTTP/1.1 connection
    that carries one request at a time, closed when the client connection goes."""
    limits = dataclasses.replace(
        route.limits, max_connections=1, pipeline_depth=0, http2=False, per_client=0
    )
    return dataclasses.replace(route, limits=limits, owner=client, client=None)


# Distinct hosts whose kind is remembered (`_is_ip` runs for every https request; parsing an
# address, or failing to parse a name, was 1.5% of the pool's CPU per request in a burst profile).
KNOWN_HOSTS = 4096


@functools.lru_cache(maxsize=KNOWN_HOSTS)
def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
