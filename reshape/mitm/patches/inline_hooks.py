"""Addon hooks run in the same pass as the event that raised them; writes leave once per pass.

Why a patch: in mitmproxy 12.2.3 every hook a layer raises (`requestheaders`, `request`,
`responseheaders`, `response`, TLS and connection hooks) leaves `ConnectionHandler.server_event`
(proxy/server.py) as a task: the task walks the whole addon chain (`AddonManager.trigger_event`,
through a generator and a context manager per addon), walks it again for the `update` hook, then
waits for the handler's lock and feeds `HookCompleted` through the layers in a second pass. In
the lab's page loads that was about 40% of the proxy's CPU (py-spy, bench/RESULTS.md). And each
`SendData` command is its own `writer.write` — mitmproxy's HTTP/1 server sends a response's head
and body as two, so a small response costs two system calls. No hook or option changes either.

The replacement `server_event` is mitmproxy's, with these changes:

- A hook whose handlers are all plain functions (the usual case: `HookTable` knows, per hook
  name, the handlers of the current addon chain, in chain order) runs at once, and its
  `HookCompleted` is fed through the layers in the same pass. Errors are logged as mitmproxy
  logs them and the next addon runs; `AddonHalt` ends the hook. A handler that needs to wait
  (DNS, a password hash) intercepts the flow (`flow.intercept()`) and resumes it later, as
  mitmproxy's own intercept feature does: the hook then completes when the flow is resumed. A
  hook with a coroutine handler, or on a handler that is not the proxy's, takes mitmproxy's own
  path.
- A connection without a socket (one with an `open_in_place`, as the engine's are:
  reshape/mitm/patches/engine_join.py) opens in the pass that asked for it: its
  `OpenConnectionCompleted` follows the event being processed, instead of coming from its
  handler task a turn of the event loop later. The requests of a new client connection waited
  behind whatever else the loop had to do (9-28 ms in the lab's page loads, a tracer); now they
  go once the read that brought them has been parsed. (The command still passes up through
  every layer, which is how the layers above learn whose connection it is.)
- Data for one connection written in one pass goes out in one `write`, before any close of that
  connection. The passes of events that say their writes may wait (`writes_may_wait`: the
  engine's responses, which arrive from many tasks in one turn of the event loop when an
  origin's packet carries several) leave theirs for the end of the turn, so that each client
  connection gets one `write` per turn; any other pass sends what is waiting first, so the
  order of the bytes never changes. With HTTP/2 browsers through the pool `StreamWriter.write`
  was the largest self time in py-spy's profile (7%; each call is a system call under uvloop).

And `Layer.handle_event` (with `Layer.__process`, which `__continue` uses) is mitmproxy's, but
a hook raised during a pass that can run inline runs where the layer raised it (`Pass`), and
the layer goes on at once instead of pausing until a `HookCompleted` comes down every layer
above it in a later event of the pass. A request's four hooks (requestheaders, request,
responseheaders, response) were four such trips from the root, through the CONNECT tunnel's
layers; without them mitmproxy's `Layer.handle_event` runs half as often per request (cProfile,
h2 load through the pool: 117 calls per request before, 61 after). A hook that cannot run
inline, or whose flow its handlers intercepted, pauses the layer as before (the pass knows it
already ran). Layers driven outside a pass (mitmproxy's own tests) see mitmproxy's behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeGuard

from mitmproxy import exceptions, flow, hooks
from mitmproxy.addonmanager import traverse
from mitmproxy.proxy import commands, events, layer, server
from mitmproxy.proxy.mode_servers import ProxyConnectionHandler
from mitmproxy.utils import asyncio_utils

from reshape.mitm.patches.base import Patch, Replacement

log = logging.getLogger("mitmproxy.addonmanager")


class PendingWrites:
    """One connection handler's data not yet written, per writer, in the order it was sent."""

    def __init__(self) -> None:
        self.chunks: dict[Any, list[bytes]] = {}
        self.scheduled = False

    def add(self, writer: Any, data: bytes) -> None:
        self.chunks.setdefault(writer, []).append(data)

    def flush(self, writer: Any) -> None:
        chunks = self.chunks.pop(writer, None)
        if chunks and not writer.is_closing():
            writer.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def flush_all(self) -> None:
        self.scheduled = False
        for writer in list(self.chunks):
            self.flush(writer)

    def flush_later(self) -> None:
        if self.chunks and not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush_all)


def pending_writes(handler: server.ConnectionHandler) -> PendingWrites:
    pending: PendingWrites | None = handler.__dict__.get("_reshape_pending_writes")
    if pending is None:
        pending = handler.__dict__["_reshape_pending_writes"] = PendingWrites()
    return pending


Handler = Callable[..., Any]


class HookTable:
    """Per hook name, the handlers of an addon chain grouped by chain entry, in order (as
    AddonManager.trigger_event calls them); None for a hook with any coroutine handler."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._chain: list[Any] | None = None
        self._length = -1
        self._handlers: dict[str, list[list[Handler]] | None] = {}

    def handlers(self, name: str) -> list[list[Handler]] | None:
        chain: list[Any] = self.manager.chain
        if chain is not self._chain or len(chain) != self._length:
            self._chain, self._length = chain, len(chain)
            self._handlers.clear()
        try:
            return self._handlers[name]
        except KeyError:
            found = self._handlers[name] = self._collect(chain, name)
            return found

    @staticmethod
    def _collect(chain: Iterable[Any], name: str) -> list[list[Handler]] | None:
        groups: list[list[Handler]] = []
        for entry in chain:
            group = []
            for addon in traverse([entry]):
                func = getattr(addon, name, None)
                if func is None or not callable(func):
                    continue  # modules named like a hook are skipped, as mitmproxy does
                if asyncio.iscoroutinefunction(func):
                    return None
                group.append(func)
            if group:
                groups.append(group)
        return groups


_ARG_NAMES: dict[type, tuple[str, ...]] = {}


def hook_args(hook: hooks.Hook) -> list[Any]:
    """`hook.args()` without looking up the dataclass fields on every call."""
    names = _ARG_NAMES.get(type(hook))
    if names is None:
        fields = dataclasses.fields(hook)  # type: ignore[arg-type]
        names = _ARG_NAMES[type(hook)] = tuple(f.name for f in fields)
    return [getattr(hook, name) for name in names]


def run_handlers(groups: list[list[Handler]], args: list[Any]) -> None:
    """As AddonManager.trigger_event, for plain functions: an error is logged and the next chain
    entry runs; AddonHalt ends the hook."""
    for group in groups:
        try:
            for handler in group:
                handler(*args)
        except exceptions.AddonHalt:
            return
        except (exceptions.OptionsError, exceptions.AddonManagerError):
            raise
        except Exception as e:
            log.error(f"Addon error: {e}", exc_info=True)


class Pass:
    """A pass of `ConnectionHandler.server_event` (one at a time: a pass never awaits). A hook
    a layer raises in it runs where it is raised if it can (`complete`), and the layer goes on
    without pausing: no `HookCompleted` has to come down the layers in a later event."""

    def __init__(self, table: HookTable) -> None:
        self.table = table
        self._intercepted: set[int] = set()  # ids of hooks run here whose flow waits

    def complete(self, hook: commands.StartHook) -> bool:
        """Run `hook` now if it can be (see `run_inline`): True if it has completed."""
        done = run_inline(self.table, hook)
        if done is False:
            self._intercepted.add(id(hook))
        return done is True

    def intercepted(self, hook: commands.StartHook) -> bool:
        """Whether `hook` ran here and its flow waits to be resumed (its layer paused)."""
        return id(hook) in self._intercepted


_current_pass: Pass | None = None


@contextlib.contextmanager
def hooks_in_place(table: HookTable | None) -> Iterator[Pass | None]:
    """While the block runs, hooks raised by any layer run where they are raised (None: no
    addon chain to run them from, e.g. a handler that is not the proxy's)."""
    global _current_pass
    _current_pass = Pass(table) if table is not None else None
    try:
        yield _current_pass
    finally:
        _current_pass = None


_FLOW_TYPES: dict[type, bool] = {}


def is_flow(data: Any) -> TypeGuard[flow.Flow]:
    """`isinstance(data, flow.Flow)` by the data's type, remembered: `Flow` is an abstract base
    class, whose `isinstance` runs through Python (`ABCMeta.__instancecheck__`) on every hook."""
    kind = type(data)
    known = _FLOW_TYPES.get(kind)
    if known is None:
        known = _FLOW_TYPES[kind] = isinstance(data, flow.Flow)
    return known


def run_inline(table: HookTable, hook: commands.StartHook) -> bool | None:
    """Run the hook now: True if it completed, False if its flow waits to be resumed, None if
    it must take mitmproxy's own path."""
    groups = table.handlers(hook.name)
    if groups is None:
        return None
    args = hook_args(hook)
    run_handlers(groups, args)
    data = args[0] if len(args) == 1 else None
    if is_flow(data):
        update = table.handlers("update")
        if update is None:
            return None  # can't happen for a hook already run: keep mitmproxy's order
        if update:
            run_handlers(update, [[data]])
        if data.intercepted:
            return False
    return True


def _completes_in_place(command: commands.Command) -> bool:
    """Whether a blocking command is a hook the current pass ran to completion just now."""
    this_pass = _current_pass
    return (
        this_pass is not None
        and isinstance(command, commands.StartHook)
        and this_pass.complete(command)
    )


def handle_event(self: layer.Layer, event: events.Event) -> layer.CommandGenerator[None]:
    """mitmproxy's `Layer.handle_event` (12.2.3), but a hook that completes in place (see
    `Pass.complete`) does not pause the layer: its reply goes straight back."""
    if self._paused:
        pause_finished = (
            isinstance(event, events.CommandCompleted) and event.command is self._paused.command
        )
        if self.debug is not None:
            yield self._Layer__debug(f"{'>>' if pause_finished else '>!'} {event}")  # type: ignore[attr-defined]
        if pause_finished:
            assert isinstance(event, events.CommandCompleted)
            yield from self._Layer__continue(event)  # type: ignore[attr-defined]
        else:
            self._paused_event_queue.append(event)
    else:
        if self.debug is not None:
            yield self._Layer__debug(f">> {event}")  # type: ignore[attr-defined]
        # `process`, inlined, as mitmproxy inlines `__process` here: one generator less per
        # layer on every event. mitmproxy keeps this loop twice for that; so does the patch,
        # with the decision that differs in `_completes_in_place`.
        # A `for` loop rather than mitmproxy's `send`/`next` in `try`: every reply here is None
        # (`next` sends None), and the loop ends the generator without raising StopIteration,
        # which costs about half a microsecond per layer and event.
        command_generator = self._handle_event(event)
        for command in command_generator:
            if self.debug is not None and not isinstance(command, commands.Log):
                yield self._Layer__debug(f"<< {command}")  # type: ignore[attr-defined]
            if command.blocking is True:
                if _completes_in_place(command):
                    continue  # a hook's reply is None
                command.blocking = self
                self._paused = layer.Paused(command, command_generator)
                yield command
                return
            yield command


def process(
    self: layer.Layer, command_generator: layer.CommandGenerator[Any], send: Any = None
) -> layer.CommandGenerator[None]:
    """mitmproxy's `Layer.__process` (12.2.3), with hooks completed in place."""
    try:
        command = command_generator.send(send)
    except StopIteration:
        return
    while True:
        if self.debug is not None and not isinstance(command, commands.Log):
            yield self._Layer__debug(f"<< {command}")  # type: ignore[attr-defined]
        if command.blocking is True:
            if _completes_in_place(command):
                try:
                    command = command_generator.send(None)  # a hook's reply is None
                except StopIteration:
                    return
                continue
            # We only want this layer to block, the outer layers should not block (mitmproxy).
            command.blocking = self
            self._paused = layer.Paused(command, command_generator)
            yield command
            return
        yield command
        try:
            command = next(command_generator)
        except StopIteration:
            return


class InlineHooks(Patch):
    """Run plain-function hooks inline and batch writes (see the module docstring)."""

    def replacements(self) -> Iterable[Replacement]:
        tables: dict[int, HookTable] = {}

        def table_of(handler: server.ConnectionHandler) -> HookTable | None:
            if not isinstance(handler, ProxyConnectionHandler):
                return None
            manager = handler.master.addons
            table = tables.get(id(manager))
            if table is None or table.manager is not manager:
                table = tables[id(manager)] = HookTable(manager)
            return table

        async def complete_when_resumed(
            handler: server.ConnectionHandler, hook: commands.StartHook, data: flow.Flow
        ) -> None:
            with handler.timeout_watchdog.disarm():
                await data.wait_for_resume()
            if hook.blocking:
                await handler.server_event(events.HookCompleted(hook))

        async def server_event(self: server.ConnectionHandler, event: events.Event) -> None:
            async with self._server_event_lock:
                # No `await` beyond this point (as in mitmproxy's own).
                self.timeout_watchdog.register_activity()
                table = table_of(self)
                pending: list[events.Event] = [event]
                writes = pending_writes(self)
                with hooks_in_place(table) as this_pass:
                    index = 0
                    while index < len(pending):
                        current = pending[index]
                        index += 1
                        try:
                            for command in self.layer.handle_event(current):
                                if isinstance(command, commands.StartHook):
                                    if this_pass is not None and this_pass.intercepted(command):
                                        done: bool | None = False  # ran in place, flow intercepted
                                    else:
                                        done = run_inline(table, command) if table else None
                                    if done is True:
                                        if command.blocking:
                                            pending.append(events.HookCompleted(command))
                                    elif done is False:
                                        data = hook_args(command)[0]
                                        asyncio_utils.create_task(
                                            complete_when_resumed(self, command, data),
                                            name=f"resume({command.name})",
                                            keep_ref=True,
                                            client=self.client.peername,
                                        )
                                    else:
                                        asyncio_utils.create_task(
                                            self.hook_task(command),
                                            name=f"handle_hook({command.name})",
                                            keep_ref=True,
                                            client=self.client.peername,
                                        )
                                elif isinstance(command, commands.OpenConnection):
                                    assert command.connection not in self.transports
                                    address = command.connection.address
                                    handler = asyncio_utils.create_task(
                                        self.open_connection(command),
                                        name=f"server connection handler {address}",
                                        keep_ref=False,
                                        client=self.client.peername,
                                    )
                                    self.transports[command.connection] = server.ConnectionIO(
                                        handler=handler
                                    )
                                    opener = getattr(command.connection, "open_in_place", None)
                                    if opener is not None:
                                        opener(self)
                                        pending.append(
                                            events.OpenConnectionCompleted(command, None)
                                        )
                                elif isinstance(command, commands.RequestWakeup):
                                    task = asyncio_utils.create_task(
                                        self.wakeup(command),
                                        name=f"wakeup timer ({command.delay:.1f}s)",
                                        keep_ref=False,
                                        client=self.client.peername,
                                    )
                                    assert task is not None
                                    self.wakeup_timer.add(task)
                                elif (
                                    isinstance(command, commands.ConnectionCommand)
                                    and command.connection not in self.transports
                                ):
                                    pass  # The connection has already been closed.
                                elif isinstance(command, commands.SendData):
                                    writer = self.transports[command.connection].writer
                                    assert writer
                                    writes.add(writer, command.data)
                                elif isinstance(command, commands.CloseTcpConnection):
                                    writes.flush(self.transports[command.connection].writer)
                                    self.close_connection(command.connection, command.half_close)
                                elif isinstance(command, commands.CloseConnection):
                                    writes.flush(self.transports[command.connection].writer)
                                    self.close_connection(command.connection, False)
                                elif isinstance(command, commands.Log):
                                    self.log(command.message, command.level)
                                else:
                                    raise RuntimeError(f"Unexpected command: {command}")
                        except Exception:
                            self.log("mitmproxy has crashed!", logging.ERROR, exc_info=True)
                if getattr(event, "writes_may_wait", False):
                    writes.flush_later()
                else:
                    writes.flush_all()

        yield server.ConnectionHandler, "server_event", server_event
        yield layer.Layer, "handle_event", handle_event
        yield layer.Layer, "_Layer__process", process
