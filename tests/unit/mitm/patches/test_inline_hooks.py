"""reshape/mitm/patches/inline_hooks.py: which hooks can run inline, and how they run."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from mitmproxy import exceptions

from reshape.mitm.patches.inline_hooks import HookTable, run_handlers


class Manager:
    def __init__(self, chain: list[Any]) -> None:
        self.chain = chain


class Plain:
    def __init__(self, seen: list[str], name: str) -> None:
        self.seen, self.name = seen, name

    def request(self, flow: object) -> None:
        self.seen.append(self.name)


class WithChild:
    def __init__(self, seen: list[str]) -> None:
        self.addons = [Plain(seen, "child")]

    def request(self, flow: object) -> None:
        raise ValueError("broken addon")


class Waits:
    async def request(self, flow: object) -> None:
        pass


def test_plain_handlers_are_grouped_by_chain_entry_in_order() -> None:
    seen: list[str] = []
    table = HookTable(Manager([Plain(seen, "a"), WithChild(seen), Plain(seen, "b")]))
    groups = table.handlers("request")
    assert groups is not None and [len(g) for g in groups] == [1, 2, 1]
    assert table.handlers("response") == []


def test_a_coroutine_handler_sends_the_hook_down_mitmproxys_own_path() -> None:
    table = HookTable(Manager([Plain([], "a"), Waits()]))
    assert table.handlers("request") is None


def test_the_table_follows_the_chain_when_addons_are_added() -> None:
    seen: list[str] = []
    chain: list[Any] = [Plain(seen, "a")]
    table = HookTable(Manager(chain))
    assert len(table.handlers("request") or []) == 1
    chain.append(Plain(seen, "b"))
    assert len(table.handlers("request") or []) == 2


def test_an_error_is_logged_and_the_next_chain_entry_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []
    table = HookTable(Manager([WithChild(seen), Plain(seen, "after")]))
    with caplog.at_level(logging.ERROR):
        run_handlers(table.handlers("request") or [], [object()])
    # As mitmproxy does: the failing entry's own children are skipped, the next entry runs.
    assert seen == ["after"]
    assert "Addon error: broken addon" in caplog.text


def test_addon_halt_ends_the_hook() -> None:
    seen: list[str] = []

    class Halts:
        def request(self, flow: object) -> None:
            raise exceptions.AddonHalt()

    table = HookTable(Manager([Halts(), Plain(seen, "never")]))
    run_handlers(table.handlers("request") or [], [object()])
    assert seen == []
