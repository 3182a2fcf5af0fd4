"""reshape/mitm/patches/inline_hooks.py: which hooks can run inline, how and where they run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from mitmproxy import connection, exceptions, http, options
from mitmproxy.proxy import commands, events, server
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layer import CommandGenerator, Layer
from mitmproxy.proxy.layers.http import HttpRequestHook
from mitmproxy.test import tflow

from reshape.mitm.patches import Patches
from reshape.mitm.patches.inline_hooks import (
    HookTable,
    InlineHooks,
    PendingWrites,
    hooks_in_place,
    run_handlers,
)


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


class Writer:
    def __init__(self, log: list[tuple[str, bytes]], name: str) -> None:
        self.log, self.name, self.closing = log, name, False

    def write(self, data: bytes) -> None:
        self.log.append((self.name, data))

    def is_closing(self) -> bool:
        return self.closing


def test_writes_wait_for_the_end_of_the_turn_and_leave_once_per_writer() -> None:
    async def main() -> list[tuple[str, bytes]]:
        log: list[tuple[str, bytes]] = []
        pending = PendingWrites()
        a, b = Writer(log, "a"), Writer(log, "b")
        pending.add(a, b"1")
        pending.flush_later()
        pending.add(b, b"x")
        pending.add(a, b"2")
        pending.flush_later()
        assert log == []
        await asyncio.sleep(0)
        return log

    assert asyncio.run(main()) == [("a", b"12"), ("b", b"x")]


def test_a_pass_that_cannot_wait_sends_what_waits_first_in_order() -> None:
    async def main() -> list[tuple[str, bytes]]:
        log: list[tuple[str, bytes]] = []
        pending = PendingWrites()
        a = Writer(log, "a")
        pending.add(a, b"deferred ")
        pending.flush_later()
        pending.add(a, b"now")
        pending.flush_all()
        await asyncio.sleep(0)
        return log

    assert asyncio.run(main()) == [("a", b"deferred now")]


def test_nothing_is_written_to_a_closing_writer() -> None:
    log: list[tuple[str, bytes]] = []
    pending = PendingWrites()
    a = Writer(log, "a")
    pending.add(a, b"late")
    a.closing = True
    pending.flush(a)
    assert log == [] and not pending.chunks


# Hooks that complete where a layer raises them (`Pass`, and the patched Layer.handle_event).


class Requester(Layer):
    """A layer that raises the `request` hook for its flow, then logs that it went on."""

    def __init__(self, flow: http.HTTPFlow) -> None:
        super().__init__(Context(tflow.tclient_conn(), options.Options()))
        self.flow = flow

    def _handle_event(self, event: events.Event) -> CommandGenerator[None]:
        yield HttpRequestHook(self.flow)
        yield commands.Log("went on")


class Intercepts:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def request(self, flow: http.HTTPFlow) -> None:
        self.seen.append("intercepts")
        flow.intercept()


@pytest.fixture
def inline_hooks() -> Iterator[None]:
    with Patches([InlineHooks()]):
        yield


def names(commands_: list[commands.Command]) -> list[str]:
    return [type(c).__name__ for c in commands_]


def hook_of(commands_: list[commands.Command]) -> commands.StartHook:
    assert len(commands_) == 1 and isinstance(commands_[0], commands.StartHook), commands_
    return commands_[0]


@pytest.mark.usefixtures("inline_hooks")
def test_a_plain_hook_completes_where_it_is_raised_and_the_layer_goes_on() -> None:
    seen: list[str] = []
    layer = Requester(tflow.tflow())
    with hooks_in_place(HookTable(Manager([Plain(seen, "a")]))):
        out = list(layer.handle_event(events.Start()))
    assert seen == ["a"]
    assert names(out) == ["Log"]  # no StartHook left for the connection handler
    assert layer._paused is None


@pytest.mark.usefixtures("inline_hooks")
def test_outside_a_pass_the_layer_pauses_as_mitmproxy_has_it() -> None:
    layer = Requester(tflow.tflow())
    out = list(layer.handle_event(events.Start()))
    assert names(out) == ["HttpRequestHook"] and out[0].blocking is layer
    assert names(list(layer.handle_event(events.HookCompleted(hook_of(out))))) == ["Log"]


@pytest.mark.usefixtures("inline_hooks")
def test_a_hook_whose_flow_is_intercepted_pauses_the_layer_and_is_not_run_again() -> None:
    seen: list[str] = []
    layer = Requester(tflow.tflow())
    with hooks_in_place(HookTable(Manager([Intercepts(seen)]))) as in_pass:
        out = list(layer.handle_event(events.Start()))
        assert in_pass is not None and in_pass.intercepted(hook_of(out))
    assert names(out) == ["HttpRequestHook"] and out[0].blocking is layer
    assert seen == ["intercepts"]  # ran once; the connection handler waits for the resume


@pytest.mark.usefixtures("inline_hooks")
def test_a_hook_with_a_coroutine_handler_takes_mitmproxys_path() -> None:
    layer = Requester(tflow.tflow())
    with hooks_in_place(HookTable(Manager([Waits()]))) as in_pass:
        out = list(layer.handle_event(events.Start()))
        assert in_pass is not None and not in_pass.intercepted(hook_of(out))
    assert names(out) == ["HttpRequestHook"] and out[0].blocking is layer


# Connections without a socket open in the pass that asks for them.


class Opener(Layer):
    """A layer that opens `server` and logs the reply it got."""

    def __init__(self, context: Context, server: connection.Server) -> None:
        super().__init__(context)
        self.server = server
        self.replies: list[object] = []

    def _handle_event(self, event: events.Event) -> CommandGenerator[None]:
        if isinstance(event, events.Start):
            err = yield commands.OpenConnection(self.server)
            self.replies.append(err if err is not None else "opened")


class Socketless(connection.Server):
    pass


def handler_with(layer_of: Any) -> Any:
    class Handler(server.ConnectionHandler):
        async def handle_hook(self, hook: commands.StartHook) -> None:
            pass

        def log(self, message: str, level: int = logging.INFO, exc_info: Any = None) -> None:
            pass

    context = Context(tflow.tclient_conn(), options.Options())
    handler = Handler(context)
    handler.layer = layer_of(context)
    return handler


@pytest.mark.usefixtures("inline_hooks")
def test_a_socketless_connection_opens_in_the_pass_that_asks_for_it() -> None:
    async def main() -> None:
        target = Socketless(address=("origin.example", 443))
        opened_by: list[object] = []
        target.open_in_place = opened_by.append  # type: ignore[attr-defined]
        handler = handler_with(lambda context: Opener(context, target))
        handler.open_connection = lambda command: asyncio.sleep(0)  # the lifetime task
        await handler.server_event(events.Start())
        assert handler.layer.replies == ["opened"]  # before server_event returned
        assert opened_by == [handler] and target in handler.transports

    asyncio.run(main())


@pytest.mark.usefixtures("inline_hooks")
def test_a_connection_with_a_socket_waits_for_its_handler_task() -> None:
    async def main() -> None:
        target = connection.Server(address=("origin.example", 443))
        handler = handler_with(lambda context: Opener(context, target))
        handler.open_connection = lambda command: asyncio.sleep(0)
        await handler.server_event(events.Start())
        assert handler.layer.replies == []  # paused until OpenConnectionCompleted comes
        assert target in handler.transports

    asyncio.run(main())
