"""The forward proxies bench/overhead compares, each started on loopback and always stopped.

Every proxy is a subprocess in its own process group (labkit/processes.py), started with its logs
in a work directory and stopped (SIGTERM, then SIGKILL to the whole group) on the way out of its
context manager, also when the body raises. A proxy that does not come up raises `ProxyStartError`
carrying its output.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import trustme

from labkit import processes
from labkit.processes import ProcessStartError

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
START_TIMEOUT = 60.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Debian's squid drops privileges to this user when started as root.
SQUID_USER = "proxy"
SQUID = "/usr/sbin/squid"
SQUID_CERTGEN = "/usr/lib/squid/security_file_certgen"

INTERCEPTED = "intercepted"
SSL_BUMP = "ssl-bump"
TUNNELLED = "tunnel, no interception"


class ProxyStartError(ProcessStartError):
    """A proxy did not come up; the message carries the tail of its output."""


@dataclass(frozen=True)
class RunningProxy:
    """A forward proxy accepting connections at `url` (http://127.0.0.1:P)."""

    url: str
    # The CA a client must trust for https through this proxy (the interception CA, or the
    # origin's CA when the proxy only tunnels).
    https_ca: Path
    https_mode: str
    ports: tuple[int, ...]
    # The proxy's process group: its workers and helpers, whose CPU time the bench reads.
    pgid: int


@dataclass(frozen=True)
class SquidBinary:
    """A squid executable and, when it can bump TLS, its certificate generator."""

    path: Path
    certgen: Path | None
    version: str

    @property
    def can_bump(self) -> bool:
        return self.certgen is not None


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU time of the live processes in process group `pgid`, from /proc."""
    total_ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited meanwhile
        # Fields after the parenthesised command (which may hold spaces): state is field 3.
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # field 5, pgrp
            total_ticks += int(fields[11]) + int(fields[12])  # fields 14, 15: utime, stime
    return total_ticks / _CLOCK_TICKS


def _running(
    name: str, argv: list[str], workdir: Path, is_ready: Callable[[], bool]
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """The proxy `argv` until the block ends, its output in workdir/NAME.log."""
    return processes.running(
        name,
        argv,
        log=workdir / f"{name}.log",
        is_ready=is_ready,
        timeout=START_TIMEOUT,
        error=ProxyStartError,
        cwd=workdir,
    )


def _healthz_ok(url: str) -> bool:
    # No proxy from the environment: the admin endpoint is on loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def mitmdump(workdir: Path, origin_ca: Path) -> Iterator[RunningProxy]:
    """Plain mitmdump 12.2.3, no addons, intercepting https with a CA in workdir/confdir."""
    port = processes.free_port()
    confdir = workdir / "confdir"
    ca = confdir / "mitmproxy-ca-cert.pem"
    argv = [
        str(VENV_BIN / "mitmdump"),
        "--listen-host",
        "127.0.0.1",
        "-p",
        str(port),
        "-q",
        "--set",
        f"ssl_verify_upstream_trusted_ca={origin_ca}",
        "--set",
        f"confdir={confdir}",
    ]
    with _running(
        "mitmdump", argv, workdir, lambda: ca.exists() and processes.accepts("127.0.0.1", port)
    ) as process:
        yield RunningProxy(f"http://127.0.0.1:{port}", ca, INTERCEPTED, (port,), process.pid)


SET_UP_SECONDS = 60


def _set_up(what: str, argv: list[str]) -> None:
    """Run a proxy's set-up step; one that fails or hangs is a `ProxyStartError` with its
    output (the bench's one-line error), not a traceback."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=SET_UP_SECONDS, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise ProxyStartError(
            f"{what} did not finish within {SET_UP_SECONDS} s ({shlex.join(argv)})"
        ) from e
    if done.returncode != 0:
        raise ProxyStartError(
            f"{what} exited with status {done.returncode}\n{done.stdout}{done.stderr}"
        )


@contextmanager
def reshape(
    workdir: Path, origin_ca: Path, policy: Path, workers: int = 1, checkout: Path = REPO
) -> Iterator[RunningProxy]:
    """`reshape run` with `policy`, ready once its admin endpoint answers /healthz with 200;
    the `reshape` of `checkout`'s own .venv (another commit's, for a before/after row)."""
    port, admin = processes.free_port(), processes.free_port()
    confdir = workdir / "confdir"
    binary = str(checkout / ".venv" / "bin" / "reshape")
    _set_up("reshape ca init", [binary, "ca", "init", "--confdir", str(confdir)])
    argv = [
        binary,
        "run",
        "--listen",
        f"127.0.0.1:{port}",
        "--admin",
        f"127.0.0.1:{admin}",
        "--confdir",
        str(confdir),
        "--upstream-ca",
        str(origin_ca),
        "--policy",
        str(policy),
    ]
    if workers != 1:
        argv += ["--workers", str(workers)]
    healthz = f"http://127.0.0.1:{admin}/healthz"
    name = "reshape" if workers == 1 else f"reshape-w{workers}"
    with _running(name, argv, workdir, lambda: _healthz_ok(healthz)) as process:
        yield RunningProxy(
            f"http://127.0.0.1:{port}",
            confdir / "mitmproxy-ca-cert.pem",
            INTERCEPTED,
            (port, admin),
            process.pid,
        )


@contextmanager
def engine_floor(workdir: Path, origin_ca: Path, policy: Path) -> Iterator[RunningProxy]:
    """reshape's engine behind the thinnest front end (bench/lab/engine_floor.py) with
    `policy`, ready once it accepts connections; its CA made by `reshape ca init`."""
    port = processes.free_port()
    confdir = workdir / "confdir"
    venv = REPO / ".venv" / "bin"
    _set_up("reshape ca init", [str(venv / "reshape"), "ca", "init", "--confdir", str(confdir)])
    argv = [
        str(venv / "python"),
        "-m",
        "bench.lab.engine_floor",
        "--listen",
        f"127.0.0.1:{port}",
        "--confdir",
        str(confdir),
        "--upstream-ca",
        str(origin_ca),
        "--policy",
        str(policy),
    ]
    # From the checkout, whose bench package the virtualenv does not install.
    with processes.running(
        "engine-floor",
        argv,
        log=workdir / "engine-floor.log",
        is_ready=lambda: processes.accepts("127.0.0.1", port),
        timeout=START_TIMEOUT,
        error=ProxyStartError,
        cwd=REPO,
    ) as process:
        yield RunningProxy(
            f"http://127.0.0.1:{port}",
            confdir / "mitmproxy-ca-cert.pem",
            INTERCEPTED,
            (port,),
            process.pid,
        )


def squid_config(
    port: int, workdir: Path, origin_ca: Path, bump_ca: Path | None, certgen: Path | None
) -> str:
    """squid.conf for a no-cache, one-worker forward proxy on 127.0.0.1:`port`.

    With `bump_ca` and `certgen` it intercepts https (ssl-bump); without, it tunnels CONNECT.
    """
    if bump_ca is not None and certgen is not None:
        key = bump_ca.with_suffix(".key")
        listen = (
            f"http_port 127.0.0.1:{port} ssl-bump generate-host-certificates=on"
            f" dynamic_cert_mem_cache_size=4MB tls-cert={bump_ca} tls-key={key}\n"
            f"sslcrtd_program {certgen} -s {workdir / 'ssl_db'} -M 4MB\n"
            "sslcrtd_children 2 startup=1 idle=1\n"
            "acl step1 at_step SslBump1\n"
            # Peek at the client hello, stare at the origin's certificate, then bump: the
            # generated certificate mimics the origin's, IP subjectAltName included.
            "ssl_bump peek step1\n"
            "ssl_bump stare all\n"
            "ssl_bump bump all\n"
            # Added to the default trust store; origin certificates are still verified.
            f"tls_outgoing_options cafile={origin_ca}\n"
        )
    else:
        listen = f"http_port 127.0.0.1:{port}\n"
    return f"""# Generated by bench/overhead/peers.py
{listen}http_access allow localhost
http_access deny all
cache deny all
cache_mem 0 MB
workers 1
pid_filename {workdir / "squid.pid"}
cache_log {workdir / "cache.log"}
access_log none
cache_store_log none
coredump_dir {workdir}
pinger_enable off
netdb_filename none
logfile_rotate 0
shutdown_lifetime 0 seconds
visible_hostname reshape-bench
mime_table /usr/share/squid/mime.conf
"""


@contextmanager
def squid(workdir: Path, origin_ca: Path, binary: SquidBinary) -> Iterator[RunningProxy]:
    """Squid with no cache and one worker; bumps https when `binary` can, else tunnels it."""
    port = processes.free_port()
    bump_ca: Path | None = None
    local_origin_ca = workdir / "origins-ca.pem"
    # Squid runs as SQUID_USER, who cannot read root's temporary directories.
    shutil.copyfile(origin_ca, local_origin_ca)
    certgen: Path | None = None
    if binary.certgen is not None:
        bump_ca = workdir / "squid-ca.pem"
        _write_bump_ca(bump_ca)
        # A copy beside the rest, so that SQUID_USER can run it wherever squid was unpacked.
        certgen = workdir / binary.certgen.name
        shutil.copy(binary.certgen, certgen)
        _set_up(
            "squid's certificate database",
            [str(certgen), "-c", "-s", str(workdir / "ssl_db"), "-M", "4MB"],
        )
    conf = workdir / "squid.conf"
    conf.write_text(squid_config(port, workdir, local_origin_ca, bump_ca, certgen))
    if os.geteuid() == 0:
        user = pwd.getpwnam(SQUID_USER)
        for path in [workdir, *workdir.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid)
    argv = [str(binary.path), "-N", "-f", str(conf)]
    try:
        with _running(
            "squid", argv, workdir, lambda: processes.accepts("127.0.0.1", port)
        ) as process:
            yield RunningProxy(
                f"http://127.0.0.1:{port}",
                bump_ca or origin_ca,
                SSL_BUMP if bump_ca else TUNNELLED,
                (port,),
                process.pid,
            )
    except ProxyStartError as error:
        raise ProxyStartError(f"{error}\n{processes.log_tails([workdir / 'cache.log'])}") from error


def _write_bump_ca(cert_path: Path) -> None:
    """An RSA CA for squid's generated certificates; the key goes next to it as .key."""
    ca = trustme.CA(organization_name="reshape bench squid", key_type=trustme.KeyType.RSA)
    ca.cert_pem.write_to_path(str(cert_path))
    key_path = cert_path.with_suffix(".key")
    ca.private_key_pem.write_to_path(str(key_path))
    key_path.chmod(0o600)


def find_squid(cache: Path, say: Callable[[str], None]) -> SquidBinary:
    """A squid that can bump TLS if one can be had, else the system's; installs squid if absent.

    Debian ships squid (GnuTLS, no ssl-bump) and squid-openssl, which conflict. When the
    GnuTLS one is installed, the same version of squid-openssl is unpacked into `cache` instead
    of replacing it: it runs with the installed squid-common files and leaves the system alone.
    """
    if not Path(SQUID).exists():
        _apt_install(["squid-openssl"], say) or _apt_install(["squid"], say)
    if not Path(SQUID).exists():
        raise ProxyStartError("squid is not installed and could not be installed")
    system = SquidBinary(Path(SQUID), None, f"{_squid_version(Path(SQUID))}, {SQUID}")
    if _built_with_openssl(system.path) and Path(SQUID_CERTGEN).exists():
        return SquidBinary(system.path, Path(SQUID_CERTGEN), system.version)
    unpacked = _unpacked_squid_openssl(cache, say)
    return unpacked or system


def _squid_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "-v"], capture_output=True, text=True, check=False).stdout
    first = out.splitlines()[0] if out else "squid (version unknown)"
    flavour = "OpenSSL" if "--with-openssl" in out else "GnuTLS" if "--with-gnutls" in out else ""
    return f"{first} ({flavour})" if flavour else first


def _built_with_openssl(binary: Path) -> bool:
    out = subprocess.run([str(binary), "-v"], capture_output=True, text=True, check=False).stdout
    return "--with-openssl" in out


def _unpacked_squid_openssl(cache: Path, say: Callable[[str], None]) -> SquidBinary | None:
    common = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "squid-common"],
        capture_output=True,
        text=True,
        check=False,
    )
    if common.returncode != 0 or not common.stdout:
        say("squid-common is not installed; squid will only tunnel https")
        return None
    version = common.stdout.strip()
    root = cache.resolve() / f"squid-openssl_{re.sub(r'[^A-Za-z0-9.+~-]', '_', version)}"
    binary, certgen = root / "usr/sbin/squid", root / "usr/lib/squid/security_file_certgen"
    if not (binary.exists() and certgen.exists()):
        say(f"unpacking squid-openssl {version} into {root} (the system squid cannot ssl-bump)")
        if not _apt_download_and_unpack(f"squid-openssl={version}", root, say):
            say("could not get squid-openssl; squid will only tunnel https")
            return None
    if not _built_with_openssl(binary):
        return None
    where = root.relative_to(REPO) if root.is_relative_to(REPO) else root
    version = f"{_squid_version(binary)}, Debian squid-openssl {version} unpacked in {where}"
    return SquidBinary(binary, certgen, version)


def _apt_download_and_unpack(spec: str, root: Path, say: Callable[[str], None]) -> bool:
    with tempfile.TemporaryDirectory(prefix="reshape-squid-deb-") as temporary:
        for attempt in range(2):
            download = subprocess.run(
                ["apt-get", "download", "-qq", spec],
                cwd=temporary,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if download.returncode == 0:
                break
            if attempt == 0 and os.geteuid() == 0:
                say("apt-get download failed; running apt-get update once")
                subprocess.run(
                    ["apt-get", "update", "-qq"], capture_output=True, timeout=300, check=False
                )
        else:
            say(f"apt-get download {spec} failed: {download.stderr.strip()}")
            return False
        debs = list(Path(temporary).glob("*.deb"))
        if len(debs) != 1:
            return False
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        unpack = subprocess.run(
            ["dpkg-deb", "-x", str(debs[0]), str(root)],
            capture_output=True,
            text=True,
            check=False,
        )
        if unpack.returncode != 0:
            say(f"dpkg-deb -x failed: {unpack.stderr.strip()}")
            return False
    return True


def _apt_install(packages: list[str], say: Callable[[str], None]) -> bool:
    if os.geteuid() != 0:
        say(f"not root: install {' '.join(packages)} yourself (apt-get install)")
        return False
    say(f"installing {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, timeout=600, check=False)
    done = subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        env=env,
        timeout=900,
        check=False,
        stdout=sys.stderr,
    )
    return done.returncode == 0
