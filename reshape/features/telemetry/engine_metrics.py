"""The engine's reports (reshape/upstream/observer.py) as Prometheus metrics."""

from __future__ import annotations

from collections.abc import Sequence

from reshape.features.telemetry import metrics
from reshape.features.telemetry.metrics import labelled
from reshape.upstream.observer import EngineObserver, Labels


class EngineMetrics(EngineObserver):
    def request_queued(self, labels: Labels) -> None:
        labelled(metrics.requests_queued_total, *labels).inc()

    def request_assigned(
        self, labels: Labels, kind: str, waited: float, *, coalesced: bool
    ) -> None:
        labelled(metrics.upstream_requests_total, *labels, kind).inc()
        labelled(metrics.request_queue_seconds, *labels).observe(waited)
        if coalesced:
            labelled(metrics.post_coalesced_total, *labels).inc()

    def request_rejected(self, labels: Labels, reason: str) -> None:
        labelled(metrics.upstream_queue_rejected_total, *labels, reason).inc()

    def request_retried(self, labels: Labels) -> None:
        labelled(metrics.upstream_retries_total, *labels).inc()

    def destination_refused(self, labels: Labels, reason: str) -> None:
        labelled(metrics.destinations_refused_total, *labels, reason).inc()

    def connection_opened(self, proto: str, tls_resumed: bool | None) -> None:
        labelled(metrics.upstream_connections_opened_total, proto).inc()
        if tls_resumed is not None:
            labelled(metrics.upstream_tls_handshakes_total, "yes" if tls_resumed else "no").inc()

    def connection_closed(self, reason: str) -> None:
        labelled(metrics.upstream_connections_closed_total, reason).inc()

    def connections_changed(self, active: int, most_per_host: int) -> None:
        metrics.upstream_connections_active.set(active)
        metrics.upstream_connections_per_host_max.set(most_per_host)

    def out_of_turn(self) -> None:
        metrics.upstream_out_of_turn_total.inc()

    def pipelining_disabled(self) -> None:
        metrics.pipelining_disabled_total.inc()

    def preconnect_finished(self, labels: Labels, used: bool) -> None:
        labelled(metrics.preconnects_total, *labels, "used" if used else "unused").inc()

    def tls_records(self, sizes: Sequence[int], small_bytes: int) -> None:
        metrics.observe_tls_records("origin", sizes, small_bytes)
