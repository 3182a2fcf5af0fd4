"""Parsing and describing HOST:PORT listen addresses."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from reshape.base.errors import UsageError


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def is_wildcard(self) -> bool:
        return self.host in ("0.0.0.0", "::", "")


def parse_listen_address(text: str, *, option: str) -> ListenAddress:
    """`HOST:PORT` or `[IPv6]:PORT` → ListenAddress; a UsageError names the option otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise UsageError(f"{option}: expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"{option}: port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"{option}: port must be 0-65535, got {port}")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise UsageError(
                f"{option}: host must be an IP address or localhost, got {host!r}"
            ) from None
    return ListenAddress(host, port)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str, *, option: str) -> tuple[Network, ...]:
    """`10.0.0.0/8,192.168.1.7` → networks (a bare address is a /32 or /128)."""
    networks = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise UsageError(f"{option}: {part!r} is not a network such as 10.0.0.0/8") from None
    return tuple(networks)
