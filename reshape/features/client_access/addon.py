"""Refuses client connections from addresses outside the operator's allow-list.

A proxy that listens beyond loopback must not be an open proxy: `reshape run` refuses to start
on such an address without `--allow-clients` (see reshape/cli.py), and this addon enforces the list
on every connection. Loopback clients are always allowed (the machine's own users and checks).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence

from mitmproxy import connection

from reshape.base.addresses import Network
from reshape.features.telemetry import metrics

log = logging.getLogger("reshape.access")


def client_allowed(address: str, allowed: Sequence[Network]) -> bool:
    """Whether a client at `address` (an IP, maybe with %zone or IPv4-mapped) may connect."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or any(ip in network for network in allowed)


class ClientAccess:
    def __init__(self, allowed: Sequence[Network]) -> None:
        self.allowed = tuple(allowed)

    def client_connected(self, client: connection.Client) -> None:
        host = client.peername[0] if client.peername else ""
        if not client_allowed(host, self.allowed):
            log.warning("refused client %s: not in --allow-clients", host)
            metrics.client_refused_total.inc()
            client.error = "reshape: client address not allowed"
