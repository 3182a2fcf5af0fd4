"""Addon hooks run in the same pass as the event that raised them; writes leave once per pass.

Why a patch: in mitmproxy 12.2.3 every hook a layer raises (`requestheaders`, `request`,
`responseheaders`, `response`, TLS and connection hooks) leaves `ConnectionHandler.server_event`
(proxy/server.py) as a task: the task walks the whole addon chain (`AddonManager.trigger_event`,
through a generator and a context manager per addon), walks it again for the `update` hook, then
waits for the handler's lock and feeds `HookCompleted` through the layers in a second pass. In
the lab's page loads that was about 40% of the proxy's CPU (py-spy, bench/RESULTS.md). And each
`SendData` command is its own `writer.write` — mitmproxy's HTTP/1 server sends a response's head
and body as two, so a small response costs two system calls. No hook or option changes either.

The replacement `server_event` is mitmproxy's, with two changes:

- A hook whose handlers are all plain functions (the usual case: `HookTable` knows, per hook
  name, the handlers of the current addon chain, in chain order) runs at once, and its
  `HookCompleted` is fed through the layers in the same pass. Errors are logged as mitmproxy
  logs them and the next addon runs; `AddonHalt` ends the hook. A handler that needs to wait
  (DNS, a password hash) intercepts the flow (`flow.intercept()`) and resumes it later, as
  mitmproxy's own intercept feature does: the hook then completes when the flow is resumed. A
  hook with a coroutine handler, or on a handler that is not the proxy's, takes mitmproxy's own
  path.
- Data for one connection written in one pass goes out in one `write`, before any close of that
  connection. The passes of events that say their writes may wait (`writes_may_wait`: the
  engine's responses, which arrive from many tasks in one turn of the event loop when an
  origin's packet carries several) leave theirs for the end of the turn, so that each client
  connection gets one `write` per turn; any other pass sends what is waiting first, so the
  order of the bytes never changes. With HTTP/2 browsers through the pool `StreamWriter.write`
  was the largest self time in py-spy's profile (7%; each call is a system call under uvloop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

from mitmproxy import exceptions, flow, hooks
from mitmproxy.addonmanager import traverse
from mitmproxy.proxy import commands, events, server
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

        def run_inline(
            handler: server.ConnectionHandler, table: HookTable, hook: commands.StartHook
        ) -> bool | None:
            """Run the hook now: True if it completed, False if its flow waits to be resumed,
            None if it must take mitmproxy's own path."""
            groups = table.handlers(hook.name)
            if groups is None:
                return None
            args = hook_args(hook)
            run_handlers(groups, args)
            data = args[0] if len(args) == 1 else None
            if isinstance(data, flow.Flow):
                update = table.handlers("update")
                if update is None:
                    return None  # can't happen for a hook already run: keep mitmproxy's order
                if update:
                    run_handlers(update, [[data]])
                if data.intercepted:
                    return False
            return True

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

                index = 0
                while index < len(pending):
                    current = pending[index]
                    index += 1
                    try:
                        for command in self.layer.handle_event(current):
                            if isinstance(command, commands.StartHook):
                                done = run_inline(self, table, command) if table else None
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
                                handler = asyncio_utils.create_task(
                                    self.open_connection(command),
                                    name=f"server connection handler {command.connection.address}",
                                    keep_ref=False,
                                    client=self.client.peername,
                                )
                                self.transports[command.connection] = server.ConnectionIO(
                                    handler=handler
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
