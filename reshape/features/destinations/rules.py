"""Which destination addresses clients may reach through the proxy — decided on IP addresses,
without sockets.

A proxy inside a network is a way into it: to the proxy itself (its admin endpoint, or a request
looping back into its own listener), to the cloud metadata service (169.254.169.254 hands out
credentials), to the machine's loopback services and to private networks. Each is refused unless
the request's policy allows it (`destinations:` in the policy, reshape/policy/schema.py), except
the proxy's own addresses, which are always refused.

The decision is made on the address actually connected to, not on the host name: a name can
resolve to anything, and resolve differently a second later (DNS rebinding). Callers check the
resolved addresses before connecting (fast refusal, no connection attempted) and the connected
peer address after (reshape/features/destinations/addon.py; the upstream engine for pooled
requests).

The classes come from IANA's special-purpose address registries, which the standard library's
`ipaddress` carries (`is_link_local`, `is_loopback`, `is_global`): whatever is not globally
reachable and not link-local or loopback is `private` (10/8, 100.64/10, 198.18/15, the
documentation ranges, 240/4, fc00::/7, ...). IPv6 forms that embed an IPv4 destination are
judged by that IPv4 address, since it is where a connection ends up: IPv4-mapped
(::ffff:0:0/96), IPv4-compatible (::/96), NAT64 (64:ff9b::/96, RFC 6052) and 6to4 (2002::/16,
RFC 3056). So 64:ff9b::a9fe:a9fe is the metadata service, and 2002:7f00:1:: is loopback.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from reshape.base.addresses import ListenAddress
from reshape.policy.schema import DestinationKnobs
from reshape.upstream.types import Refusal

Reason = Literal["own_address", "link_local", "private", "loopback"]
REASONS: tuple[Reason, ...] = ("own_address", "link_local", "private", "loopback")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# The cloud metadata services' IPv6 address (AWS) lies inside fc00::/7, a private range; it is
# classed with link-local, whose default is deny.
_METADATA = (ipaddress.ip_address("fd00:ec2::254"),)
# "This network" (RFC 791): 0.0.0.0 reaches this machine on Linux, as loopback does; the rest of
# 0.0.0.0/8 is never a valid destination.
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
# Registry entries that Python 3.12's early patch releases do not carry yet (later ones do):
# listed so the same address gets the same class on every 3.12.x.
_NOT_GLOBAL_SINCE_3_12_4 = (
    ipaddress.ip_network("192.0.0.0/24"),  # IETF protocol assignments (but .9 and .10 below)
    ipaddress.ip_network("64:ff9b:1::/48"),  # NAT64 local use (RFC 8215): operator-defined
)
_GLOBAL_EXCEPTIONS = (ipaddress.ip_address("192.0.0.9"), ipaddress.ip_address("192.0.0.10"))
# IPv6 prefixes whose low 32 bits are the IPv4 destination.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")

_DESCRIPTIONS: dict[Reason, str] = {
    "link_local": "link-local",
    "private": "a private address",
    "loopback": "loopback",
}


def ip_of(address: str | IPAddress) -> IPAddress:
    """The address as an IP: a zone (`%eth0`) is dropped, an IPv4-mapped IPv6 address
    (::ffff:169.254.169.254) becomes the IPv4 address it reaches. ValueError if not an IP."""
    if isinstance(address, str):
        return _parsed(address)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# Every request is checked against the addresses of its host: parsing them (and `category`'s
# walk over the special networks) was ~3% of the proxy's CPU through the pool (py-spy, the lab's
# app page). A proxy sees a bounded working set of addresses; the caches are bounded too.
@functools.lru_cache(maxsize=4096)
def _parsed(address: str) -> IPAddress:
    return ip_of(ipaddress.ip_address(address.strip("[]").split("%", 1)[0]))


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 destination an IPv6 address stands for (mapped, IPv4-compatible, NAT64, 6to4),
    or None. `::` and `::1` embed nothing: they are this machine's own IPv6 addresses."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


@functools.lru_cache(maxsize=4096)
def category(ip: IPAddress) -> Reason | None:
    """Which guarded kind of address `ip` is (never "own_address"), or None for a globally
    reachable one."""
    ip = embedded_ipv4(ip) or ip_of(ip)
    if ip in _METADATA or ip.is_link_local:
        return "link_local"
    # 0.0.0.0 and :: as destinations reach this machine, as loopback does.
    if ip.is_loopback or ip.is_unspecified or ip in _THIS_NETWORK:
        return "loopback"
    if ip in _GLOBAL_EXCEPTIONS:
        return None
    if (
        not ip.is_global
        # fec0::/10: deprecated, but routed inside the sites that still use it
        or (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local)
        or any(ip in network for network in _NOT_GLOBAL_SINCE_3_12_4)
    ):
        return "private"
    return None


def _loopback_only(ip: IPAddress) -> bool:
    return ip.is_loopback or ip.is_unspecified


@dataclass(frozen=True)
class OwnAddresses:
    """The addresses the proxy listens on (proxy, admin).

    A listener on a wildcard address (0.0.0.0, ::) listens on every local address, so for its
    port `is_local` decides — a callable so the caller can ask the kernel (see
    reshape/features/destinations/addon.py), and tests can answer without one.
    """

    exact: frozenset[tuple[IPAddress, int]] = frozenset()
    wildcard_ports: frozenset[int] = frozenset()
    is_local: Callable[[IPAddress], bool] = field(default=_loopback_only, compare=False)

    @classmethod
    def of(
        cls,
        listens: Iterable[ListenAddress],
        is_local: Callable[[IPAddress], bool] = _loopback_only,
    ) -> OwnAddresses:
        exact: set[tuple[IPAddress, int]] = set()
        wildcard: set[int] = set()
        for listen in listens:
            if listen.port == 0:
                continue  # not known until bound; the caller adds the bound address
            if listen.is_wildcard:
                wildcard.add(listen.port)
            elif listen.host == "localhost":
                exact.update((ipaddress.ip_address(h), listen.port) for h in ("127.0.0.1", "::1"))
            else:
                exact.add((ip_of(listen.host), listen.port))
        return cls(frozenset(exact), frozenset(wildcard), is_local)

    def with_address(self, listen: ListenAddress) -> OwnAddresses:
        more = OwnAddresses.of([listen])
        return OwnAddresses(
            self.exact | more.exact, self.wildcard_ports | more.wildcard_ports, self.is_local
        )

    @property
    def ports(self) -> frozenset[int]:
        return self.wildcard_ports | {port for _, port in self.exact}

    def __contains__(self, address: object) -> bool:
        if not isinstance(address, tuple) or len(address) != 2:
            return False
        ip, port = ip_of(address[0]), address[1]
        if (ip, port) in self.exact:
            return True
        if ip.is_unspecified:  # connecting to 0.0.0.0:P reaches whatever listens locally on P
            return port in self.ports
        return port in self.wildcard_ports and (_loopback_only(ip) or self.is_local(ip))


def refusal(
    address: tuple[str | IPAddress, int], knobs: DestinationKnobs, own: OwnAddresses
) -> Reason | None:
    """Why a connection to `address` (an IP and port) must not be made, or None if it may.

    The proxy's own addresses are refused whatever the policy says; the other kinds follow the
    policy's `destinations` knobs. ValueError if the host is not an IP address (resolve first).
    """
    ip, port = ip_of(address[0]), address[1]
    if (ip, port) in own:
        return "own_address"
    kind = category(ip)
    if kind is None or getattr(knobs, kind) == "allow":
        return None
    return kind


def refusal_message(reason: Reason, ip: str, port: int, policy: str, host: str = "") -> str:
    """One line for the client and the log: what was refused and why."""
    shown = str(ip_of(ip)) if not host or host == str(ip_of(ip)) else f"{host} ({ip_of(ip)})"
    embedded = embedded_ipv4(ip_of(ip))
    if embedded is not None:
        shown += f" (reaching {embedded})"
    if reason == "own_address":
        return f"reshape: destination {shown} port {port} is this proxy's own address"
    return f"reshape: destination {shown} is {_DESCRIPTIONS[reason]} (policy {policy!r} denies it)"


class OwnAddressBook:
    """The proxy's own addresses as they are now: one per process, updated when a port 0 is
    resolved. Compared by identity (routes holding it share pools)."""

    def __init__(self, current: OwnAddresses) -> None:
        self.current = current

    def add(self, address: ListenAddress) -> None:
        self.current = self.current.with_address(address)


@dataclass(frozen=True)
class PeerRules:
    """A route's peer check (reshape.upstream.types.PeerCheck): the policy's `destinations`
    knobs and the proxy's own addresses, on the address a connection actually reached."""

    knobs: DestinationKnobs
    # Out of the repr, which names the pool in the budget the workers share (the same knobs are
    # the same pool in every worker; each has its own book): reshape/upstream/budget/client.py.
    own: OwnAddressBook = field(repr=False)

    def refusal(self, peer: tuple[str, int], host: str, policy: str) -> Refusal | None:
        reason = refusal(peer, self.knobs, self.own.current)
        if reason is None:
            return None
        message = refusal_message(reason, peer[0], peer[1], policy, host)
        return Refusal(reason, message.removeprefix("reshape: ") + " (after connecting)")
