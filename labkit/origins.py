"""Real origin servers on loopback addresses, for tests and benchmarks.

Each origin is a subprocess (nginx, or hypercorn serving `static_app`) wrapped in a context manager
that returns only once the server accepts connections and, on exit, stops and reaps it — also when
the body raises. 127.0.0.2, 127.0.0.3, … are distinct hosts to a browser and to the proxy, so a
multi-origin site needs no DNS.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from labkit import processes
from labkit.pki import IssuedCert
from labkit.processes import ProcessStartError
from labkit.static_app import CONTENT_TYPES, DEFAULT_CONTENT_TYPE, ROOT_ENV

NGINX = "/usr/sbin/nginx"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0
# How often to retry nginx on a fresh port when the one picked was taken meanwhile.
_PORT_ATTEMPTS = 5
# nginx creates these scratch directories at start-up, by default under /var/lib/nginx.
_NGINX_TEMP_KINDS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
_REPO_ROOT = Path(__file__).resolve().parents[1]


class OriginStartError(ProcessStartError):
    """An origin server did not come up; the message carries the tail of its logs."""


@dataclass(frozen=True)
class Origin:
    """A running origin server: where it listens and what it offers."""

    host: str
    port: int
    scheme: str
    protocols: tuple[str, ...]
    # Written by the server for every request it answers; gone with the workdir unless one was
    # given to the context manager.
    access_log: Path | None = None

    def url(self, path: str = "/") -> str:
        """An absolute URL on this origin."""
        if not path.startswith("/"):
            path = "/" + path
        return f"{self.scheme}://{self.host}:{self.port}{path}"


@contextmanager
def nginx_origin(
    root: Path,
    host: str = "127.0.0.2",
    *,
    port: int = 0,
    tls: IssuedCert | None = None,
    http2: bool = False,
    workdir: Path | None = None,
    keepalive_requests: int = 10_000,
) -> Iterator[Origin]:
    """nginx serving `root` statically on `host`; HTTPS with `tls`, h2 (via ALPN) with `http2`.

    `keepalive_requests`: nginx closes a connection after answering this many requests on it
    (the last one says `Connection: close`) — an origin that ends pipelines early. Below the
    default it also lingers on close (`lingering_close always`): otherwise nginx closes at once
    when the next pipelined request has not reached it yet, that request's arrival resets the
    connection, and the reset can destroy the announcing answer in nginx's (corked) send buffer,
    so the close looks unannounced (a broken pipeline) about once in twenty test runs.

    With `port=0` a free port is picked. Logs and the generated nginx.conf go to `workdir`
    (a temporary directory, removed afterwards, if None).
    """
    if http2 and tls is None:
        # Cleartext `listen ... http2` would speak only prior-knowledge h2c, not HTTP/1.1.
        raise ValueError("nginx_origin: http2=True needs tls (h2 is offered via ALPN)")
    protocols = ("h2", "http/1.1") if http2 else ("http/1.1",)
    with _directory(workdir, "reshape-nginx-") as directory:
        process, chosen = _start_nginx(
            root.resolve(), host, port, tls, http2, directory, keepalive_requests
        )
        try:
            yield Origin(
                host, chosen, "https" if tls else "http", protocols, directory / "access.log"
            )
        finally:
            processes.stop(process, STOP_TIMEOUT)


@contextmanager
def hypercorn_origin(
    root: Path,
    host: str = "127.0.0.3",
    *,
    port: int = 0,
    tls: IssuedCert | None = None,
    workdir: Path | None = None,
    keep_alive_max_requests: int = 1_000_000,
    http2: bool = True,
    keep_alive_timeout: float = 5.0,
) -> Iterator[Origin]:
    """hypercorn serving `root` statically on `host`; with `tls`, HTTPS offering h2 and HTTP/1.1
    (HTTP/1.1 only if not `http2`).

    `keep_alive_max_requests`: hypercorn ends a connection (HTTP/2: GOAWAY) after this many
    requests; its own default, 1,000, would make "one connection" depend on the request count.
    `keep_alive_timeout`: seconds an idle connection is kept (hypercorn's default, 5 s; nginx's
    origins here keep 65 s).

    With `port=0` a free port is picked. Logs go to `workdir` (temporary if None).
    """
    with _directory(workdir, "reshape-hypercorn-") as directory:
        # The parent binds (never listens), so the port is ours from the start, and hypercorn,
        # handed the socket, starts listening — a connect succeeds exactly when it serves.
        with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as error:
                raise OriginStartError(f"hypercorn: cannot bind {host}:{port}: {error}") from error
            chosen = sock.getsockname()[1]
            argv = [
                sys.executable,
                "-m",
                "hypercorn",
                "--bind",
                f"fd://{sock.fileno()}",
                "--workers",
                "0",  # serve in this process: one pid to stop, nothing to orphan
                "--worker-class",
                "uvloop",
                "--graceful-timeout",
                "1",
                "--config",
                str(
                    _hypercorn_config(directory, keep_alive_max_requests, http2, keep_alive_timeout)
                ),
                "--access-logfile",
                str(directory / "access.log"),
                "--error-logfile",
                str(directory / "error.log"),
            ]
            if tls is not None:
                argv += ["--certfile", str(tls.cert_path), "--keyfile", str(tls.key_path)]
            argv.append("labkit.static_app:app_from_environment()")
            env = {
                **os.environ,
                ROOT_ENV: str(root.resolve()),
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")])
                ),
            }
            process = processes.start(
                "hypercorn",
                argv,
                log=directory / "hypercorn.output",
                logs=[directory / "error.log"],
                is_ready=lambda: processes.accepts(host, chosen),
                timeout=START_TIMEOUT,
                error=OriginStartError,
                cwd=directory,
                env=env,
                pass_fds=(sock.fileno(),),
            )
        try:
            yield Origin(
                host,
                chosen,
                "https" if tls else "http",
                ("h2", "http/1.1") if tls and http2 else ("http/1.1",),
                directory / "access.log",
            )
        finally:
            processes.stop(process, STOP_TIMEOUT)


def nginx_config(
    root: Path,
    host: str,
    port: int,
    tls: IssuedCert | None,
    http2: bool,
    directory: Path,
    keepalive_requests: int = 10_000,
) -> str:
    """The nginx.conf for one static origin whose pid, logs and temp files live in `directory`."""
    listen = f"{_bracketed(host)}:{port}" + (" ssl" if tls else "") + (" http2" if http2 else "")
    types = "\n".join(
        f"        {media_type} {' '.join(sorted(s.lstrip('.') for s in suffixes))};"
        for media_type, suffixes in _suffixes_by_type().items()
    )
    temp_paths = "\n".join(
        f"    {kind}_temp_path {_quote(directory / 'tmp' / kind)};" for kind in _NGINX_TEMP_KINDS
    )
    tls_lines = (
        f"""
        ssl_certificate {_quote(tls.cert_path)};
        ssl_certificate_key {_quote(tls.key_path)};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:origin_tls:1m;"""
        if tls
        else ""
    )
    lingering = "\n    lingering_close always;" if keepalive_requests < 10_000 else ""
    # As root, nginx's workers would switch to `nobody`, who cannot enter mkdtemp's 0700 dirs.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""# Generated by labkit/origins.py
{user}worker_processes 1;
pid {_quote(directory / "nginx.pid")};
error_log {_quote(directory / "error.log")} warn;

events {{
    worker_connections 1024;
}}

http {{
    types {{
{types}
    }}
    default_type {DEFAULT_CONTENT_TYPE};
{temp_paths}

    log_format origin '$remote_addr:$remote_port conn=$connection req=$connection_requests '
                      '"$request" $status $body_bytes_sent $request_time';
    access_log {_quote(directory / "access.log")} origin;

    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 65s;
    keepalive_requests {keepalive_requests};{lingering}
    # The bytes on the wire must be the bytes on disk, which the site manifests hash.
    gzip off;
    server_tokens off;

    server {{
        listen {listen};
        server_name _;
        root {_quote(root)};{tls_lines}

        location / {{
            # Resource Timing's request and response times for cross-origin pages too.
            add_header Timing-Allow-Origin "*" always;
        }}
    }}
}}
"""


def _start_nginx(
    root: Path,
    host: str,
    port: int,
    tls: IssuedCert | None,
    http2: bool,
    directory: Path,
    keepalive_requests: int,
) -> tuple[subprocess.Popen[bytes], int]:
    # nginx cannot be handed a bound socket, so a picked port may be taken before nginx binds it:
    # then pick again.
    attempts = _PORT_ATTEMPTS if port == 0 else 1
    for attempt in range(1, attempts + 1):
        chosen = port or processes.free_port(host)
        conf = directory / "nginx.conf"
        conf.write_text(nginx_config(root, host, chosen, tls, http2, directory, keepalive_requests))
        pid_file = directory / "nginx.pid"
        pid_file.unlink(missing_ok=True)
        for kind in _NGINX_TEMP_KINDS:
            (directory / "tmp" / kind).mkdir(parents=True, exist_ok=True)
        argv = [
            NGINX,
            "-p",
            str(directory),
            "-e",
            str(directory / "error.log"),
            "-c",
            str(conf),
            "-g",
            "daemon off;",
        ]
        try:
            process = processes.start(
                "nginx",
                argv,
                log=directory / "nginx.output",
                logs=[directory / "error.log"],
                is_ready=functools.partial(_nginx_ready, pid_file, host, chosen),
                timeout=START_TIMEOUT,
                error=OriginStartError,
                cwd=directory,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            )
        except OriginStartError as error:
            if attempt < attempts and "Address already in use" in str(error):
                continue
            raise
        return process, chosen
    raise AssertionError("unreachable: the last attempt returns or raises")


def _nginx_ready(pid_file: Path, host: str, port: int) -> bool:
    # The pid file appears only after nginx bound its port, so a connect then reaches nginx and
    # not whoever else might hold the port.
    return pid_file.exists() and processes.accepts(host, port)


def _hypercorn_config(
    directory: Path, keep_alive_max_requests: int, http2: bool, keep_alive_timeout: float
) -> Path:
    config = directory / "hypercorn.toml"
    alpn = '["h2", "http/1.1"]' if http2 else '["http/1.1"]'
    config.write_text(
        f"keep_alive_max_requests = {keep_alive_max_requests}\nalpn_protocols = {alpn}\n"
        f"keep_alive_timeout = {keep_alive_timeout}\n"
    )
    return config


@contextmanager
def _directory(given: Path | None, prefix: str) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given.resolve()
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as temporary:
        yield Path(temporary)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _quote(path: Path) -> str:
    escaped = str(path).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _suffixes_by_type() -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for suffix, media_type in CONTENT_TYPES.items():
        grouped.setdefault(media_type, []).append(suffix)
    return grouped
