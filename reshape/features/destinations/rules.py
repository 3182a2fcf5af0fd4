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
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from reshape.base.addresses import ListenAddress
from reshape.policy.schema import DestinationKnobs

Reason = Literal["own_address", "link_local", "private", "loopback"]
REASONS: tuple[Reason, ...] = ("own_address", "link_local", "private", "loopback")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# The cloud metadata services' IPv6 address (AWS) lies inside fc00::/7, a private range; it is
# classed with link-local, whose default is deny.
_METADATA = (ipaddress.ip_address("fd00:ec2::254"),)
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
_PRIVATE = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)

_DESCRIPTIONS: dict[Reason, str] = {
    "link_local": "link-local",
    "private": "a private address",
    "loopback": "loopback",
}


def ip_of(address: str | IPAddress) -> IPAddress:
    """The address as an IP: a zone (`%eth0`) is dropped, an IPv4-mapped IPv6 address
    (::ffff:169.254.169.254) becomes the IPv4 address it reaches. ValueError if not an IP."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.strip("[]").split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def category(ip: IPAddress) -> Reason | None:
    """Which guarded kind of address `ip` is (never "own_address"), or None for any other."""
    ip = ip_of(ip)
    if ip in _METADATA or any(ip in network for network in _LINK_LOCAL):
        return "link_local"
    # 0.0.0.0 and :: as destinations reach this machine, as loopback does.
    if ip.is_loopback or ip.is_unspecified:
        return "loopback"
    if any(ip in network for network in _PRIVATE):
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
    if reason == "own_address":
        return f"reshape: destination {shown} port {port} is this proxy's own address"
    return f"reshape: destination {shown} is {_DESCRIPTIONS[reason]} (policy {policy!r} denies it)"
