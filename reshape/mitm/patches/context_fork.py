"""A layer's context is forked without building a server connection that is thrown away."""

from __future__ import annotations

from collections.abc import Iterable

from mitmproxy.proxy import context

from reshape.mitm.patches.base import Patch, Replacement


class ForkContextsWithoutAServer(Patch):
    """Replace `Context.fork` with one that does not construct a `Server` first.

    Why: mitmproxy 12.2.3's `Context.fork` (proxy/context.py), which `HttpLayer.make_stream`
    calls for every request, builds the copy through `Context.__init__`, which constructs a
    fresh `connection.Server` (a dataclass of ~30 fields, with a `uuid4` id), and then replaces
    it with the parent's server. That throwaway object was 2.2% of the pool's CPU in a profile of
    bursts of browser-like requests on one HTTP/2 tunnel (py-spy). The copy here has the same
    four attributes with the same values: the client, the options, the parent's server and a
    copy of its layer list. No hook runs there.
    """

    def replacements(self) -> Iterable[Replacement]:
        def fork(self: context.Context) -> context.Context:
            copy = context.Context.__new__(context.Context)
            copy.client = self.client
            copy.options = self.options
            copy.server = self.server
            copy.layers = self.layers.copy()
            return copy

        yield context.Context, "fork", fork
