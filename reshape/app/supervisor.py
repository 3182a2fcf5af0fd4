"""`reshape run --workers N`: N proxy processes on one port (SO_REUSEPORT), one merged /metrics.

The supervisor checks everything once (policy, CA, port), starts the workers, serves the admin
endpoint with every worker's metrics merged (prometheus_client's multiprocess mode), restarts a
worker that dies, and on SIGTERM passes the signal on and waits for the workers to drain.

Policy reloads: every worker watches the policy file itself (reshape/policy/reload.py), so all of
them converge on the file's last valid version; SIGHUP to the supervisor is passed on to every
worker. The supervisor also keeps its own copy of the last valid version, which a restarted worker
starts from — the file may be invalid by then, and a worker must not die of it nor run an older
policy than its siblings.

SIGUSR1 (the request log was rotated) is passed on to every worker, each of which has the file
open.

Per-host caps hold across the workers: the supervisor runs the budget broker
(reshape/upstream/budget/) on a unix socket beside the metrics; each worker's engine asks it for
a slot before it opens an origin connection, and a worker that dies gives its slots back as its
socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from reshape.app.admin import AdminContent
from reshape.app.config import RunConfig
from reshape.app.runtime import log_startup, prepare, stop_signals
from reshape.app.serve import (
    WORKER_BUDGET_ENV,
    WORKER_POLICY_ENV,
    WORKER_READY,
    start_admin,
    worker_environment,
)
from reshape.base.addresses import ListenAddress
from reshape.base.errors import ReshapeError
from reshape.features.onboarding.downloads import CaDownloads
from reshape.features.request_log.addon import RequestLogFile
from reshape.features.telemetry.metrics import BudgetCollector
from reshape.policy.loader import parse_policy_text
from reshape.policy.reload import PolicyHolder, read_policy_text, watch_policy
from reshape.upstream.budget.broker import BudgetBroker

log = logging.getLogger("reshape.supervisor")

READY_TIMEOUT = 30.0
# A worker that dies this soon after starting, this many times in a row, is failing at start-up,
# not crashing once: the supervisor gives up instead of restarting it forever.
CRASH_LOOP_SECONDS = 5.0
CRASH_LOOP_LIMIT = 3
# A unix socket's path has room for 107 bytes; past this the broker's goes to /tmp instead.
SOCKET_PATH_MAX = 100


def claim_port(address: ListenAddress) -> ListenAddress:
    """Fail now if the port is taken (even by another SO_REUSEPORT user); resolve port 0.

    Binding without SO_REUSEPORT fails if anyone holds the port, so two reshape instances never
    silently share one port. With SO_REUSEADDR, as the listeners themselves bind (asyncio's
    default), so that the connections of an instance just stopped, in TIME-WAIT for a minute,
    do not hold it: a restart failed with "address already in use" where `--workers 1` did not.
    """
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address.host, address.port))
        except OSError as e:
            reason = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
            raise ReshapeError(f"cannot listen on {address}: {reason}") from None
        return ListenAddress(address.host, probe.getsockname()[1])


@dataclass
class Worker:
    index: int
    process: asyncio.subprocess.Process
    started: float


def budget_socket(metrics_dir: str) -> Path:
    """Where the budget broker listens: beside the metrics (a directory only this user can
    enter), or in a directory of its own under /tmp if that path is too long for a socket."""
    path = Path(metrics_dir) / "budget.sock"
    if len(str(path)) <= SOCKET_PATH_MAX:
        return path
    return Path(tempfile.mkdtemp(prefix="reshape-", dir="/tmp")) / "budget.sock"


class Supervisor:
    def __init__(self, config: RunConfig, metrics_dir: str, budget: Path) -> None:
        self.config = config
        self.metrics_dir = metrics_dir
        self.budget = budget
        # The last valid policy file's text, which (re)started workers begin with.
        self.policy_snapshot = Path(metrics_dir) / "policy-snapshot.yaml"
        self.workers: dict[int, Worker] = {}
        self.quick_deaths: dict[int, int] = {}  # worker index → consecutive early deaths
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=metrics_dir)

    def healthy(self) -> bool:
        return len(self.workers) == self.config.workers and all(
            w.process.returncode is None for w in self.workers.values()
        )

    async def spawn(self, index: int) -> Worker:
        env = {
            **os.environ,
            **worker_environment(self.config),
            "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir,
            WORKER_POLICY_ENV: str(self.policy_snapshot),
            WORKER_BUDGET_ENV: str(self.budget),
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "reshape.cli",
            "_worker",
            str(index),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT)
        except TimeoutError:
            line = b""
        if line != WORKER_READY:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise ReshapeError(f"worker {index} failed to start (exit status {process.returncode})")
        worker = Worker(index, process, time.monotonic())
        self.workers[index] = worker
        return worker

    async def run(self, stop: asyncio.Event) -> None:
        """Keep N workers alive until `stop` is set."""
        while not stop.is_set():
            waits = {asyncio.ensure_future(w.process.wait()): w for w in self.workers.values()}
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait([stopper, *waits], return_when=asyncio.FIRST_COMPLETED)
            for future in waits:
                future.cancel()
            stopper.cancel()
            for future in done:
                if future is stopper:
                    continue
                worker = waits[future]
                if stop.is_set():
                    continue
                mark_process_dead(worker.process.pid, self.metrics_dir)
                del self.workers[worker.index]
                lived = time.monotonic() - worker.started
                log.error(
                    "worker %d (pid %d) exited with status %s after %.1f s",
                    worker.index,
                    worker.process.pid,
                    worker.process.returncode,
                    lived,
                )
                quick = (
                    self.quick_deaths.get(worker.index, 0) + 1 if lived < CRASH_LOOP_SECONDS else 0
                )
                self.quick_deaths[worker.index] = quick
                if quick >= CRASH_LOOP_LIMIT:
                    raise ReshapeError(
                        f"worker {worker.index} died {quick} times within "
                        f"{CRASH_LOOP_SECONDS:.0f} s of starting; stopping"
                    )
                await asyncio.sleep(0.5 * quick)  # back off while it keeps dying young
                await self.spawn(worker.index)
                log.info("worker %d restarted", worker.index)

    def save_policy(self, text: str) -> None:
        """Replace the snapshot in one rename, so a worker starting now reads all of it."""
        partial = self.policy_snapshot.with_suffix(".partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, self.policy_snapshot)

    def forward_sighup(self) -> None:
        self.forward(signal.SIGHUP)

    def forward(self, sig: signal.Signals) -> None:
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(sig)

    async def stop_all(self) -> None:
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
        deadline = self.config.drain_seconds + 5.0
        for worker in self.workers.values():
            try:
                await asyncio.wait_for(worker.process.wait(), deadline)
            except TimeoutError:
                log.error("worker %d did not stop in time; killing it", worker.index)
                worker.process.kill()
                await worker.process.wait()


async def serve_supervised(config: RunConfig) -> None:
    prepared = prepare(config)
    config = replace(config, listen=claim_port(config.listen))
    if config.request_log is not None:  # fail here, in one line, not in every worker
        RequestLogFile(config.request_log).close()
    text = read_policy_text(config.policy_path)  # the text a restarted worker begins with
    holder = PolicyHolder(config.policy_path, parse_policy_text(text, config.policy_path))
    metrics_dir = tempfile.mkdtemp(prefix="reshape-metrics-")
    broker = BudgetBroker(budget_socket(metrics_dir))
    supervisor = Supervisor(config, metrics_dir, broker.path)
    supervisor.registry.register(BudgetCollector(lambda: broker.stats))
    supervisor.save_policy(text)
    holder.on_change(lambda old, new: supervisor.save_policy(holder.text or ""))
    content = AdminContent(
        proxy_address=config.listen,
        ca=CaDownloads.of(prepared.ca.certificate),
        registry=supervisor.registry,
        is_healthy=supervisor.healthy,
    )
    admin, admin_address = await start_admin(config, content)
    stop = stop_signals()
    # Reopen the request log (rotated): every worker has its own copy of the file open.
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGUSR1, supervisor.forward, signal.SIGUSR1
    )
    watcher = watch_policy(holder, after_sighup=supervisor.forward_sighup)
    await broker.start()
    try:
        for index in range(config.workers):
            await supervisor.spawn(index)
        log_startup(config, prepared, config.listen, admin_address)
        await supervisor.run(stop)
        log.info(
            "stopping: workers drain requests in flight (%.0f s at most)", config.drain_seconds
        )
    finally:
        watcher.cancel()
        await supervisor.stop_all()
        await broker.stop()
        await admin.stop()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        if broker.path.parent != Path(metrics_dir):
            shutil.rmtree(broker.path.parent, ignore_errors=True)
    log.info("stopped")
