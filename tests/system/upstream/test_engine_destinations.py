"""The pool's connections are checked on the address actually connected to (DNS rebinding): a
refused peer is cut off before a byte is sent (through the proxy the client gets 403:
tests/addons/test_destinations_addon.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from prometheus_client import REGISTRY

from reshape.base.addresses import ListenAddress
from reshape.features.destinations.rules import OwnAddressBook, OwnAddresses, PeerRules
from reshape.policy.schema import DestinationKnobs
from reshape.upstream.engine import DestinationRefused, Route
from tests.support.inprocess_engine import HOST, fetch, limits, running

DENY_LOOPBACK = DestinationKnobs(loopback="deny")


def refused_count(policy: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "reshape_destinations_refused_total", {"policy": policy, "arm": "-", "reason": reason}
    )
    return value or 0.0


ALLOW_ALL = DestinationKnobs()


def checked(route: Route, own: OwnAddresses, knobs: DestinationKnobs = ALLOW_ALL) -> Route:
    """The route with the peer check a policy's `destinations` and the proxy's addresses make."""
    return dataclasses.replace(route, peer_check=PeerRules(knobs, OwnAddressBook(own)))


@pytest.mark.asyncio
async def test_a_peer_the_policy_refuses_gets_no_byte_of_the_request() -> None:
    async with running(limits()) as (engine, route, origin):
        denied = dataclasses.replace(checked(route, OwnAddresses(), DENY_LOOPBACK), policy="strict")
        before = refused_count("strict", "loopback")
        with pytest.raises(DestinationRefused, match=r"loopback .*strict.*after connecting"):
            await fetch(engine, denied, "/0/secret")
        assert refused_count("strict", "loopback") == before + 1
        await asyncio.sleep(0.1)
        assert origin.requests == []  # connected, then closed before the request was written
        # The same origin under a policy that allows loopback is served.
        assert await fetch(engine, checked(route, OwnAddresses()), "/0/fine") == b"fine"


@pytest.mark.asyncio
async def test_the_proxys_own_address_is_refused_whatever_the_policy() -> None:
    async with running(limits()) as (engine, route, origin):
        own = OwnAddresses.of([ListenAddress(HOST, origin.port)])
        with pytest.raises(DestinationRefused, match="this proxy's own address"):
            await fetch(engine, checked(route, own), "/0/loop")
        assert origin.requests == []
