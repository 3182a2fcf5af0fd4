"""What the engine reports as it works: the interface telemetry implements.

The engine knows nothing of Prometheus (or of any other part of reshape): it calls these methods,
and reshape/features/telemetry/engine_metrics.py turns them into metrics. The base class does
nothing, so the engine runs the same with no one listening (tests, embedding). `labels` is the
route's `(policy, arm)`: the engine carries them, never reads them.
"""

from __future__ import annotations

from collections.abc import Sequence

Labels = tuple[str, str]


class EngineObserver:
    def request_queued(self, labels: Labels) -> None:
        """A request found no connection free and waits in its pool's queue."""

    def request_assigned(
        self, labels: Labels, kind: str, waited: float, *, coalesced: bool
    ) -> None:
        """A request got a connection of `kind` (new, reused, pipelined, multiplexed,
        preconnected) after `waited` seconds; `coalesced`: its head and body leave together."""

    def request_rejected(self, labels: Labels, reason: str) -> None:
        """A request was answered 503 for `reason` (queue_full, queue_timeout)."""

    def request_retried(self, labels: Labels) -> None:
        """A request went unanswered on a lost connection and goes again."""

    def destination_refused(self, labels: Labels, reason: str) -> None:
        """A connection reached an address the route's peer check refuses (`reason`)."""

    def connection_opened(self, proto: str, tls_resumed: bool | None) -> None:
        """A connection is up, speaking `proto` (h1, h2); `tls_resumed` None: no TLS."""

    def connection_closed(self, reason: str) -> None:
        """A connection that came up has gone: the pool closed it (a `CloseReason` value), or
        it was `lost` (engine.LOST)."""

    def connections_changed(self, active: int, most_per_host: int) -> None:
        """The engine's connections now (connecting ones included), and the most to any one
        destination host."""

    def out_of_turn(self) -> None:
        """An HTTP/1.1 origin sent data while no request was outstanding (its connection
        closes; nothing of it is delivered)."""

    def pipelining_disabled(self) -> None:
        """An origin broke a pipeline: it is no longer pipelined to."""

    def preconnect_finished(self, labels: Labels, used: bool) -> None:
        """A warm connection opened for `labels` was used by a request, or closed unused."""

    def tls_records(self, sizes: Sequence[int], small_bytes: int) -> None:
        """Plaintext sizes of the TLS records a sized connection wrote in one write."""
