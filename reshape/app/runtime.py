"""Process start-up: prepare (policy, CA, trust), run one proxy process, shut down gracefully.

Where bytes enter: mitmproxy's listener on `config.listen` (ProxyProcess). Which module decides:
the addons added in `ProxyProcess.__init__`, in order. Where bytes leave: mitmproxy's server
connections (and, with later issues, reshape's upstream engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mitmproxy.version
from mitmproxy import options
from mitmproxy.master import Master
from mitmproxy.utils import asyncio_utils

import reshape
from reshape.app.authority import CertificateAuthority, init_ca
from reshape.app.config import (
    DEFAULT_ORIGIN_CONNECT_TIMEOUT,
    DEFAULT_ORIGIN_READ_TIMEOUT,
    RunConfig,
)
from reshape.base.addresses import ListenAddress, Network
from reshape.base.errors import ReshapeError
from reshape.features.client_access.addon import ClientAccess
from reshape.features.client_errors.addon import ClientErrors
from reshape.features.client_errors.rules import (
    DEFAULT_CLIENT_IDLE_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_HEAD_BYTES,
)
from reshape.features.client_errors.silent_clients import SilentClients
from reshape.features.destinations.addon import Destinations, own_addresses
from reshape.features.early_hints.addon import EarlyHints
from reshape.features.onboarding.addon import ONBOARDING_HOST, Onboarding
from reshape.features.onboarding.downloads import CaDownloads
from reshape.features.onboarding.site import OnboardingSite
from reshape.features.pool.addon import PoolRouting
from reshape.features.pool.routes import BROWSER_LIKE
from reshape.features.preconnect.addon import Preconnect
from reshape.features.proxy_auth.addon import EVERY_CLIENT, ProxyAuthentication
from reshape.features.proxy_auth.users import Users, users_for_run
from reshape.features.request_framing.addon import RequestFraming
from reshape.features.request_log.addon import RequestRecords
from reshape.features.request_streaming.addon import RequestStreaming
from reshape.features.split_requests.addon import SplitRequests
from reshape.features.telemetry import metrics
from reshape.features.telemetry.addon import Telemetry
from reshape.features.telemetry.engine_metrics import EngineMetrics
from reshape.features.tls_records.addon import TlsRecords
from reshape.features.trailers.addon import Trailers
from reshape.mitm.addons import proxy_addons
from reshape.mitm.client_alpn import PreferH2ToClients
from reshape.mitm.connections import (
    close_client_connection,
    close_server_connection,
    end_client_connections,
)
from reshape.mitm.patches import Patches
from reshape.mitm.patches.authority_parse_cache import CacheAuthorityParses
from reshape.mitm.patches.body_size_check import CheckBodySizesFromHeads
from reshape.mitm.patches.client_tls_contexts import ReuseClientTlsContexts
from reshape.mitm.patches.connection_teardown import FinishConnectionTeardown
from reshape.mitm.patches.context_fork import ForkContextsWithoutAServer
from reshape.mitm.patches.early_hints import SendEarlyHints
from reshape.mitm.patches.engine_join import JoinEngine
from reshape.mitm.patches.h2_client_hpack import ClientHpackCoders
from reshape.mitm.patches.h2_frame_trace import ReceiveFramesUntraced
from reshape.mitm.patches.h2_header_validation import ValidateH2HeadersInOnePass
from reshape.mitm.patches.h2_held_output import HoldHttp2Output
from reshape.mitm.patches.http1_head_guard import GuardHttp1Heads
from reshape.mitm.patches.http1_trailers import CarryHttp1Trailers
from reshape.mitm.patches.http2_flood_guard import GuardHttp2Floods
from reshape.mitm.patches.http2_frame_size import DefaultFrameSizeForClients
from reshape.mitm.patches.inline_hooks import InlineHooks
from reshape.mitm.patches.listen_backlog import ListenBacklog
from reshape.mitm.patches.message_typecheck import SkipMessageTypecheck
from reshape.mitm.patches.option_reads import ReadOptionsWithoutCopies
from reshape.mitm.patches.origin_connect_timeout import OriginConnectTimeout
from reshape.mitm.patches.origin_first_byte_timeout import OriginFirstByteTimeout
from reshape.mitm.patches.request_framing import FrameRequests
from reshape.mitm.patches.reuse_port import ListenWithReusePort
from reshape.mitm.patches.server_first_tunnels import OpenSilentTunnels
from reshape.mitm.patches.split_requests import ReportSplitRequests
from reshape.mitm.patches.tls_record_sizes import SizeTlsRecords
from reshape.mitm.patches.tunnel_passthrough import SendTunnelDataDirectly
from reshape.policy.chooser import PolicyChooser
from reshape.policy.loader import load_policy_file
from reshape.policy.reload import PolicyHolder
from reshape.policy.schema import PolicyFile, UpstreamKnobs
from reshape.policy.selection import label_values
from reshape.upstream.engine import Engine
from reshape.upstream.trust import write_trust_bundle

log = logging.getLogger("reshape")

# Connections the kernel may queue for the proxy's listener (capped by net.core.somaxconn).
LISTEN_BACKLOG = 4096
# After the drain, how long mitmproxy may take to tear down the client connections left.
CLIENT_TEARDOWN_SECONDS = 2.0


@dataclass(frozen=True)
class Prepared:
    """Everything checked before any socket is opened."""

    policy_file: PolicyFile
    ca: CertificateAuthority
    ca_created: bool
    trust_bundle: Path
    # Proxy authentication (`--users`): the file and its users, checked; None: off.
    users_path: Path | None = None
    users: Users | None = None
    # The admin endpoint, which the proxy refuses as a destination
    # (reshape/features/destinations/rules.py).
    admin: ListenAddress | None = None


def prepare(config: RunConfig) -> Prepared:
    policy_file = load_policy_file(config.policy_path)
    ca, created = init_ca(config.confdir)
    trust_bundle = write_trust_bundle(config.confdir, config.upstream_ca)
    users = users_for_run(config.users) if config.users else None
    return Prepared(policy_file, ca, created, trust_bundle, config.users, users, config.admin)


def stop_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (Ctrl-C)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class ProxyProcess:
    """One mitmproxy master with reshape's addons, listening on `listen`."""

    def __init__(
        self,
        listen: ListenAddress,
        confdir: Path,
        prepared: Prepared,
        *,
        reuse_port: bool,
        allow_clients: Sequence[Network] = (),
        policy: PolicyHolder | None = None,
        request_log: Path | None = None,
        log_requests: bool = False,
        client_header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        client_idle_timeout: float = DEFAULT_CLIENT_IDLE_TIMEOUT,
        origin_timeouts: tuple[float, float] = (
            DEFAULT_ORIGIN_CONNECT_TIMEOUT,
            DEFAULT_ORIGIN_READ_TIMEOUT,
        ),
    ) -> None:
        self.listen = listen
        self.prepared = prepared
        # The policy in force (reloadable); `prepared.policy_file` is only the one at start-up.
        self.policy = policy or PolicyHolder(None, prepared.policy_file)
        self.policy.on_outcome(lambda outcome: metrics.policy_reloads_total.labels(outcome).inc())
        self.telemetry = Telemetry()
        self.engine = Engine(prepared.trust_bundle, EngineMetrics())
        self.master = Master(options.Options(), with_termlog=False)
        self.master.addons.add(*proxy_addons())
        if prepared.users_path is not None:
            # First, so an unauthenticated client learns nothing from the addons after it. Only
            # when on: its hooks wait for password hashes, which no request should pay for
            # otherwise.
            self.master.addons.add(ProxyAuthentication(prepared.users_path, prepared.users))
        # After it (it reads Proxy-Authorization): hop-by-hop fields go before anything is sent.
        self.master.addons.add(RequestFraming())
        # After it too, and before the addons that answer locally (they hold the body again).
        self.master.addons.add(RequestStreaming())
        self.master.addons.add(
            ClientAccess(allow_clients or (EVERY_CLIENT if prepared.users else ())),
            PreferH2ToClients(),
            # Before the addons that check or route destinations: its name resolves nowhere.
            Onboarding(OnboardingSite(CaDownloads.of(prepared.ca.certificate)), prepared.admin),
            PolicyChooser(self.policy),
            self.telemetry,
        )
        self.destinations = Destinations(  # after PolicyChooser: checks by the policy chosen
            self.policy,
            own_addresses(listen, prepared.admin),
            close_server=close_server_connection,
        )
        self.master.addons.add(self.destinations)
        # Every request's route; its connections are checked on the address they reach against
        # the proxy's own addresses and the policy, as mitmproxy's are (Destinations).
        self.routing = PoolRouting(default_knobs(origin_timeouts), self.destinations.book)
        self.master.addons.add(RequestRecords(request_log, log_requests))
        self.master.addons.add(
            Preconnect(self.engine, self.policy, self.routing, confdir, shared=reuse_port)
        )
        early_hints = EarlyHints()  # after Destinations: what it refused is not a page load
        self.master.addons.add(early_hints)
        tls_records, split_requests = TlsRecords(), SplitRequests()
        self.master.addons.add(tls_records, split_requests)
        self.master.addons.add(Trailers())  # after Telemetry: wraps its stream callable
        client_errors = ClientErrors()  # counts bad input; the patches refuse what hooks miss
        self.master.addons.add(
            client_errors,
            SilentClients(client_header_timeout, client_errors.report, close_client_connection),
        )
        # Installed when the process starts (`start`), removed when it stops.
        self.patches = Patches(
            [
                *([ListenWithReusePort()] if reuse_port else []),
                InlineHooks(),  # hooks in the pass that raised them; one write per pass
                SkipMessageTypecheck(),
                ReadOptionsWithoutCopies(),  # option reads: no deep copy of a bool or a str
                CheckBodySizesFromHeads(),  # body-size checks from the raw head
                CacheAuthorityParses(),  # Host and :authority parsed once per text
                ReuseClientTlsContexts(),  # a client's TLS: the host's certificate loaded once
                ForkContextsWithoutAServer(),  # a request's context without a throwaway server
                ValidateH2HeadersInOnePass(),  # h2's received heads: browsers' and origins'
                ListenBacklog(LISTEN_BACKLOG),  # connection storms (bench/soak)
                SizeTlsRecords(tls_records.record_sizes),
                ReportSplitRequests(split_requests.request_split),
                SendEarlyHints(
                    early_hints.links_for, early_hints.hints_sent, early_hints.interim_seen
                ),
                CarryHttp1Trailers(),
                SendTunnelDataDirectly(),  # a CONNECT tunnel's bytes skip Http1Server's send
                # A tunnel to a server that speaks first gets its greeting; a silent one ends.
                OpenSilentTunnels(client_errors.report, header_timeout=client_header_timeout),
                GuardHttp1Heads(
                    client_errors.report,
                    max_head_bytes=DEFAULT_MAX_HEAD_BYTES,
                    header_timeout=client_header_timeout,
                ),
                FrameRequests(client_errors.report),  # Host, refusals (request_framing)
                GuardHttp2Floods(client_errors.report),
                DefaultFrameSizeForClients(),  # h2spec http2/4.2/3
                ClientHpackCoders(),  # HPACK: the same bytes and headers, less work
                ReceiveFramesUntraced(),  # no repr of every frame for a log that drops it
                FinishConnectionTeardown(),  # a flood's close used to leave its socket open
                # Requests to the engine, in process; the rest (upgrades) on mitmproxy's own
                # connections, which get the engine's kind of timeouts too.
                JoinEngine(self.engine, self.routing.route_for, client_idle_timeout),
                HoldHttp2Output(),  # an engine answer's frames to an HTTP/2 client: one write
                OriginConnectTimeout(origin_timeouts[0]),
                OriginFirstByteTimeout(origin_timeouts[1]),
            ]
        )
        self.master.options.update(
            listen_host=listen.host,
            listen_port=listen.port,
            confdir=str(confdir),
            ssl_verify_upstream_trusted_ca=str(prepared.trust_bundle),
            block_global=False,  # ClientAccess decides who may connect (--allow-clients)
            # Request bodies above this stream to the origin instead of being held whole.
            stream_large_bodies="1m",
            # Connect only once a request is known: the engine carries requests over its own
            # connections, so one opened at CONNECT time (eager) would go unused.
            connection_strategy="lazy",
        )
        metrics.precreate(label_values(self.policy.current))
        self.policy.on_change(self._policy_changed)
        metrics.build_info.labels(reshape.__version__, mitmproxy.version.VERSION).set(1)
        self._exception_handler = contextlib.ExitStack()

    @property
    def proxyserver(self):  # mitmproxy.addons.proxyserver.Proxyserver
        return self.master.addons.get("proxyserver")

    def _policy_changed(self, old: PolicyFile, new: PolicyFile) -> None:
        metrics.precreate(label_values(new))
        self.engine.retire_pools(self.routing.shared_limits(new))

    async def start(self) -> ListenAddress:
        """Listen and run; a ReshapeError (e.g. port in use) if the listener cannot start."""
        self.patches.install()
        self.engine.start()
        self._exception_handler.enter_context(
            asyncio_utils.install_exception_handler(self.master._asyncio_exception_handler)
        )
        self._exception_handler.enter_context(asyncio_utils.set_eager_task_factory())
        ok = await self.proxyserver.setup_servers()
        instances = list(self.proxyserver.servers)
        if not ok or not instances or not instances[0].is_running:
            reason = next(
                (str(i.last_exception) for i in instances if i.last_exception), "unknown error"
            )
            self._exception_handler.close()
            await self.engine.stop()
            self.patches.uninstall()
            raise ReshapeError(f"cannot listen on {self.listen}: {_strip_mitmproxy_hint(reason)}")
        await self.master.running()
        host, port = self.proxyserver.listen_addrs()[0][:2]
        self.destinations.listening_on((host, port))
        return ListenAddress(host, port)

    @property
    def is_listening(self) -> bool:
        return any(instance.is_running for instance in self.proxyserver.servers)

    async def stop(self, drain_seconds: float) -> None:
        """Stop accepting, let requests in flight finish (at most `drain_seconds`), shut down."""
        for instance in list(self.proxyserver.servers):
            if instance.is_running:
                await instance.stop()
        deadline = time.monotonic() + drain_seconds
        while self.telemetry.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.telemetry.in_flight:
            log.warning(
                "drain timed out; abandoning %d requests in flight", self.telemetry.in_flight
            )
        await end_client_connections(self.proxyserver, CLIENT_TEARDOWN_SECONDS)
        await self.master.done()
        await self.engine.stop()
        await _end_leftover_tasks()
        self._exception_handler.close()
        self.patches.uninstall()


async def _end_leftover_tasks() -> None:
    """Cancel what is still running (idle keep-alive connections, timers) and wait for it, so the
    process ends without "Task was destroyed" or cancelled-callback noise."""
    current = asyncio.current_task()
    leftovers = [task for task in asyncio.all_tasks() if task is not current]
    for task in leftovers:
        task.cancel()
    await asyncio.gather(*leftovers, return_exceptions=True)


def default_knobs(origin_timeouts: tuple[float, float]) -> UpstreamKnobs:
    """The upstream knobs of policies without `upstream:`: a browser's limits, with the connect
    and read timeouts of `--origin-connect-timeout` and `--origin-read-timeout`."""
    connect, read = origin_timeouts
    return dataclasses.replace(BROWSER_LIKE, connect_timeout=connect, read_timeout=read)


def _strip_mitmproxy_hint(reason: str) -> str:
    # mitmproxy appends "Try specifying a different port by using `--mode ...`": not our CLI.
    first = reason.split("\n", 1)[0]
    return first.split(" with ", 1)[1] if " with " in first else first


def log_startup(
    config: RunConfig, prepared: Prepared, listen: ListenAddress, admin: ListenAddress
) -> None:
    ca = prepared.ca
    log.info(
        "reshape %s (mitmproxy %s), pid %d",
        reshape.__version__,
        mitmproxy.version.VERSION,
        os.getpid(),
    )
    log.info("proxy listening on %s", listen)
    log.info("admin endpoint on http://%s (/metrics /healthz /proxy.pac)", admin)
    log.info(
        "onboarding page (the CA as PEM, p12, cer): http://%s/, and through the proxy at http://%s/",
        admin,
        ONBOARDING_HOST,
    )
    log.info(
        "CA %s %s, SHA-256 %s",
        "created" if prepared.ca_created else "loaded",
        ca.cert_path,
        ca.sha256_fingerprint,
    )
    log.info(
        "policy file %s: default %r, %d policies, %d rules, %d experiments",
        config.policy_path,
        prepared.policy_file.default,
        len(prepared.policy_file.policies),
        len(prepared.policy_file.rules),
        len(prepared.policy_file.experiments),
    )
    log.info("origins verified against %s", prepared.trust_bundle)
    if prepared.users is not None:
        users, path = prepared.users.describe(), prepared.users_path
        log.info("proxy authentication (Basic): %s, from %s", users, path)
    if config.workers > 1:
        log.info("%d worker processes share the listen port (SO_REUSEPORT)", config.workers)
