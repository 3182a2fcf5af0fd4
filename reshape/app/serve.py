"""`reshape run` with one process, and the body of each worker process when there are several."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
from dataclasses import asdict, replace
from pathlib import Path

from prometheus_client import REGISTRY

from reshape.app.admin import AdminContent, AdminServer
from reshape.app.config import RunConfig
from reshape.app.heap import freeze_startup_heap
from reshape.app.runtime import Prepared, ProxyProcess, log_startup, prepare, stop_signals
from reshape.base.addresses import ListenAddress
from reshape.base.errors import ReshapeError
from reshape.features.onboarding.downloads import CaDownloads
from reshape.policy.reload import PolicyHolder, watch_policy
from reshape.upstream.budget.client import BudgetClient

log = logging.getLogger("reshape")

WORKER_CONFIG_ENV = "RESHAPE_WORKER_CONFIG"
WORKER_READY = b"reshape-worker-ready\n"
# The supervisor's copy of the last valid policy file, which a (re)started worker begins with.
WORKER_POLICY_ENV = "RESHAPE_WORKER_POLICY"
# The unix socket of the supervisor's budget broker: per-host caps shared by all workers.
WORKER_BUDGET_ENV = "RESHAPE_WORKER_BUDGET"


async def start_admin(
    config: RunConfig, content: AdminContent
) -> tuple[AdminServer, ListenAddress]:
    admin = AdminServer(config.admin, content, allowed=config.allow_clients)
    try:
        return admin, await admin.start()
    except OSError as e:
        raise ReshapeError(f"cannot listen on admin {config.admin}: {e.strerror or e}") from None


def local_admin_content(
    config: RunConfig, prepared: Prepared, process: ProxyProcess
) -> AdminContent:
    return AdminContent(
        proxy_address=config.listen,
        ca=CaDownloads.of(prepared.ca.certificate),
        registry=REGISTRY,
        is_healthy=lambda: process.is_listening,
    )


def proxy_process(
    config: RunConfig, prepared: Prepared, holder: PolicyHolder, *, reuse_port: bool
) -> ProxyProcess:
    """The proxy process `config` asks for (one of `--workers N` with `reuse_port`)."""
    return ProxyProcess(
        config.listen,
        config.confdir,
        prepared,
        reuse_port=reuse_port,
        allow_clients=config.allow_clients,
        policy=holder,
        request_log=config.request_log,
        log_requests=config.log_requests,
        client_header_timeout=config.client_header_timeout,
        client_idle_timeout=config.client_idle_timeout,
        origin_timeouts=(config.origin_connect_timeout, config.origin_read_timeout),
    )


async def serve_single(config: RunConfig) -> None:
    prepared = prepare(config)
    holder = PolicyHolder(config.policy_path, prepared.policy_file)
    process = proxy_process(config, prepared, holder, reuse_port=False)
    admin, admin_address = await start_admin(config, local_admin_content(config, prepared, process))
    try:
        listen = await process.start()
    except ReshapeError:
        await admin.stop()
        raise
    if listen != config.listen:  # port 0 → the PAC file must name the real port
        admin.content = local_admin_content(
            RunConfig(**{**asdict(config), "listen": listen}), prepared, process
        )
    log_startup(config, prepared, listen, admin_address)
    freeze_startup_heap()
    watcher = watch_policy(holder)
    await stop_signals().wait()
    watcher.cancel()
    log.info(
        "stopping: no new connections; draining requests in flight (%.0f s at most)",
        config.drain_seconds,
    )
    await process.stop(config.drain_seconds)
    await admin.stop()
    log.info("stopped")


def worker_environment(config: RunConfig) -> dict[str, str]:
    """The environment entry that hands a worker its configuration."""
    data = asdict(config)
    data["listen"] = str(config.listen)
    data["admin"] = str(config.admin)
    data["allow_clients"] = ",".join(str(n) for n in config.allow_clients)
    data["request_log"] = str(config.request_log) if config.request_log else None
    return {WORKER_CONFIG_ENV: json.dumps(data, default=str)}


def worker_config() -> RunConfig:
    from reshape.base.addresses import parse_listen_address, parse_networks

    data = json.loads(os.environ[WORKER_CONFIG_ENV])
    return RunConfig(
        listen=parse_listen_address(data["listen"], option="--listen"),
        admin=parse_listen_address(data["admin"], option="--admin"),
        policy_path=Path(data["policy_path"]),
        confdir=Path(data["confdir"]),
        upstream_ca=Path(data["upstream_ca"]) if data["upstream_ca"] else None,
        workers=data["workers"],
        drain_seconds=data["drain_seconds"],
        allow_clients=parse_networks(data["allow_clients"], option="--allow-clients"),
        request_log=Path(data["request_log"]) if data["request_log"] else None,
        users=Path(data["users"]) if data.get("users") else None,
        client_header_timeout=data["client_header_timeout"],
        client_idle_timeout=data["client_idle_timeout"],
        origin_connect_timeout=data["origin_connect_timeout"],
        origin_read_timeout=data["origin_read_timeout"],
        log_level=data["log_level"],
        log_format=data["log_format"],
        log_requests=data["log_requests"],
    )


def die_with_parent() -> None:
    """Ask Linux to send SIGTERM to this worker if the supervisor dies without stopping it."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() == 1:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


async def serve_worker(index: int, config: RunConfig) -> None:
    """One of N processes sharing the listen port; the supervisor serves /metrics for all."""
    die_with_parent()
    # Start from the supervisor's last valid copy: the file itself may have turned invalid since
    # the other workers loaded it. Then watch the file itself, like every other worker.
    snapshot = os.environ.get(WORKER_POLICY_ENV)
    prepared = prepare(replace(config, policy_path=Path(snapshot)) if snapshot else config)
    holder = PolicyHolder(config.policy_path, prepared.policy_file)
    process = proxy_process(config, prepared, holder, reuse_port=True)
    budget = await join_budget(process)
    await process.start()
    freeze_startup_heap()
    watcher = watch_policy(holder)
    log.info("worker %d (pid %d) listening on %s", index, os.getpid(), config.listen)
    sys.stdout.buffer.write(WORKER_READY)
    sys.stdout.buffer.flush()
    await stop_signals().wait()
    watcher.cancel()
    await process.stop(config.drain_seconds)
    if budget is not None:
        await budget.close()


async def join_budget(process: ProxyProcess) -> BudgetClient | None:
    """Share the per-host caps with the other workers, through the supervisor's broker."""
    path = os.environ.get(WORKER_BUDGET_ENV)
    if not path:
        return None
    try:
        budget = await BudgetClient.connect(Path(path), process.engine)
    except OSError as e:
        raise ReshapeError(f"cannot reach the supervisor's connection budget {path}: {e}") from None
    process.engine.budget = budget
    return budget
