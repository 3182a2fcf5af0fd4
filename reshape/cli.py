"""The `reshape` command line: run, health, ca init|show, policy check, users, report.

`reshape run`'s addresses, directories, allow-list and log settings also come from the
environment (RESHAPE_LISTEN, RESHAPE_ADMIN, RESHAPE_POLICY, RESHAPE_CONFDIR,
RESHAPE_ALLOW_CLIENTS, RESHAPE_LOG_LEVEL, RESHAPE_LOG_FORMAT) when the flag is not given: a
container sets them once and its health check (`reshape health`) reads the same RESHAPE_ADMIN.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import reshape
from reshape.app import config as defaults
from reshape.app.config import RunConfig
from reshape.app.logs import FORMATS, LEVELS
from reshape.base.addresses import parse_listen_address, parse_networks
from reshape.base.errors import ReshapeError, UsageError

log = logging.getLogger("reshape")

ENVIRONMENT_PREFIX = "RESHAPE_"


def _env(name: str, default: str) -> str:
    """The default of a flag: RESHAPE_<NAME> from the environment, else `default`."""
    return os.environ.get(ENVIRONMENT_PREFIX + name, default)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reshape",
        description="A forward proxy that reshapes browser-origin traffic.",
    )
    parser.add_argument("--version", action="version", version=f"reshape {reshape.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="start the proxy")
    run.add_argument(
        "--listen",
        default=_env("LISTEN", defaults.DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help="proxy address (default %(default)s; env RESHAPE_LISTEN)",
    )
    run.add_argument(
        "--admin",
        default=_env("ADMIN", defaults.DEFAULT_ADMIN),
        metavar="HOST:PORT",
        help="admin endpoint: /metrics /healthz /proxy.pac, the onboarding page "
        "(default %(default)s; env RESHAPE_ADMIN)",
    )
    run.add_argument(
        "--policy",
        type=Path,
        default=Path(_env("POLICY", str(defaults.DEFAULT_POLICY))),
        metavar="FILE",
        help="policy file (default: the one shipped with reshape, %(default)s; env RESHAPE_POLICY)",
    )
    _confdir(run)
    run.add_argument(
        "--upstream-ca",
        type=Path,
        metavar="FILE",
        help="extra CA bundle (PEM) trusted for origins, besides the system store",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="proxy processes sharing the listen port (default 1)",
    )
    run.add_argument(
        "--drain-seconds",
        type=float,
        default=defaults.DEFAULT_DRAIN_SECONDS,
        metavar="S",
        help="on SIGTERM, wait at most S seconds for requests in flight",
    )
    run.add_argument(
        "--allow-clients",
        default=_env("ALLOW_CLIENTS", ""),
        metavar="CIDR[,CIDR...]",
        help="client networks allowed besides loopback; required when --listen or --admin "
        "is not a loopback address (env RESHAPE_ALLOW_CLIENTS)",
    )
    run.add_argument(
        "--request-log",
        type=Path,
        metavar="FILE",
        help="append one JSON line per completed request (what `reshape report --log` reads)",
    )
    run.add_argument(
        "--users",
        nargs="?",
        const=_DEFAULT_USERS,
        type=Path,
        metavar="FILE",
        help="require proxy authentication (Basic) by the users in FILE: reshape's own "
        "(`reshape users`), an htpasswd file of bcrypt entries (`htpasswd -B`) or an LDAP "
        "directory (mitmproxy's proxyauth syntax); mode 0600 "
        "(default: CONFDIR/users)",
    )
    run.add_argument(
        "--client-header-timeout",
        type=float,
        default=defaults.DEFAULT_HEADER_TIMEOUT,
        metavar="S",
        help="a client must send each request head within S seconds, else 408 "
        "(default %(default)s)",
    )
    run.add_argument(
        "--client-idle-timeout",
        type=float,
        default=defaults.DEFAULT_CLIENT_IDLE_TIMEOUT,
        metavar="S",
        help="an exchange whose client sends none of its request body and takes none of its "
        "response for S seconds ends (400, or the response cut off), so that a stalled client "
        "gives back its origin connection (default %(default)s)",
    )
    run.add_argument(
        "--origin-connect-timeout",
        type=float,
        default=defaults.DEFAULT_ORIGIN_CONNECT_TIMEOUT,
        metavar="S",
        help="policies without upstream: (mitmproxy's own origin connections) give up "
        "connecting after S seconds, 502 (default %(default)s; pooled: the policy's)",
    )
    run.add_argument(
        "--origin-read-timeout",
        type=float,
        default=defaults.DEFAULT_ORIGIN_READ_TIMEOUT,
        metavar="S",
        help="policies without upstream: wait S seconds for a response head once the request "
        "is sent, then 504; a streamed request body's pauses are the client's and do not count "
        "(default %(default)s; pooled: the policy's)",
    )

    run.add_argument(
        "--pid-file",
        type=Path,
        metavar="FILE",
        help="write the process id here while running (for kill -HUP, kill -USR1)",
    )
    run.add_argument(
        "--log-level",
        choices=LEVELS,
        default=_env("LOG_LEVEL", "info"),
        help="log records from this level up (default %(default)s; env RESHAPE_LOG_LEVEL)",
    )
    run.add_argument(
        "--log-format",
        choices=FORMATS,
        default=_env("LOG_FORMAT", "text"),
        help="text for a terminal, json for one object per line (default %(default)s; "
        "env RESHAPE_LOG_FORMAT)",
    )
    run.add_argument(
        "--log-requests",
        action="store_true",
        help="log every completed request at info, not only failures",
    )

    health = commands.add_parser(
        "health", help="exit 0 if a running reshape says it is healthy (container health checks)"
    )
    health.add_argument(
        "--admin",
        default=_env("ADMIN", defaults.DEFAULT_ADMIN),
        metavar="HOST:PORT",
        help="its admin endpoint (default %(default)s; env RESHAPE_ADMIN)",
    )
    health.add_argument("--timeout", type=float, default=3.0, metavar="S")

    ca = commands.add_parser("ca", help="the interception CA")
    ca_commands = ca.add_subparsers(dest="ca_command", required=True, metavar="ACTION")
    _confdir(ca_commands.add_parser("init", help="create the CA, or reuse the one in confdir"))
    show = ca_commands.add_parser("show", help="path, fingerprint and how to trust the CA")
    _confdir(show)
    show.add_argument(
        "--admin",
        default=_env("ADMIN", defaults.DEFAULT_ADMIN),
        metavar="HOST:PORT",
        help="admin address to mention for downloading /ca.pem",
    )

    policy = commands.add_parser("policy", help="policy files")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = policy_commands.add_parser("check", help="validate a policy file")
    check.add_argument("file", type=Path)

    report = commands.add_parser("report", help="compare the arms of an experiment")
    report.add_argument("--experiment", required=True, metavar="NAME")
    source = report.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prometheus",
        metavar="URL",
        help="a Prometheus server scraping reshape (credentials: https://USER:PASSWORD@host)",
    )
    source.add_argument("--log", type=Path, metavar="FILE", help="a `run --request-log` file")
    report.add_argument(
        "--since",
        metavar="DURATION",
        help="only the last DURATION, as Prometheus writes it (30s, 15m, 1h30m, 1d, 1w)",
    )
    report.add_argument(
        "--prometheus-token-file",
        type=Path,
        metavar="FILE",
        help="send the bearer token in FILE to Prometheus",
    )
    report.add_argument(
        "--prometheus-header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="send this header to Prometheus (repeatable), e.g. 'X-Scope-OrgID: team'",
    )
    report.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write the report as JSON to FILE (- or none: stdout, instead of the table)",
    )
    report.add_argument(
        "--csv",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write the report as CSV rows to FILE (- or none: stdout, instead of the table)",
    )
    report.add_argument(
        "--html", type=Path, metavar="FILE", help="write one self-contained page with the charts"
    )
    report.add_argument("--plot", type=Path, metavar="DIR", help="write the charts as PNG files")

    users = commands.add_parser("users", help="users for proxy authentication (run --users)")
    users_commands = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = users_commands.add_parser("add", help="add a user, or change a user's password")
    add.add_argument("name")
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from one line of stdin"
    )
    remove = users_commands.add_parser("remove", help="remove a user")
    remove.add_argument("name")
    listing = users_commands.add_parser("list", help="list the users' names")
    for sub in (add, remove, listing):
        _confdir(sub)
        sub.add_argument("--users", type=Path, metavar="FILE", help="default: CONFDIR/users")

    worker = commands.add_parser("_worker")  # started by the supervisor; not for people
    worker.add_argument("index", type=int)
    return parser


def _confdir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--confdir",
        type=Path,
        default=Path(_env("CONFDIR", str(defaults.DEFAULT_CONFDIR))),
        metavar="DIR",
        help="CA and state directory (default %(default)s; env RESHAPE_CONFDIR)",
    )


def run_config(args: argparse.Namespace) -> RunConfig:
    # Defaults from the environment bypass argparse's choices.
    if args.log_level not in LEVELS:
        raise UsageError(f"--log-level / RESHAPE_LOG_LEVEL: expected one of {', '.join(LEVELS)}")
    if args.log_format not in FORMATS:
        raise UsageError(f"--log-format / RESHAPE_LOG_FORMAT: expected one of {', '.join(FORMATS)}")
    if not 1 <= args.workers <= defaults.MAX_WORKERS:
        raise UsageError(
            f"--workers must be 1 to {defaults.MAX_WORKERS} (one per core is usual), "
            f"got {args.workers}"
        )
    for option in (
        "client_header_timeout",
        "client_idle_timeout",
        "origin_connect_timeout",
        "origin_read_timeout",
    ):
        if not getattr(args, option) > 0:
            flag = "--" + option.replace("_", "-")
            raise UsageError(f"{flag} must be positive, got {getattr(args, option)}")
    if args.drain_seconds < 0:
        raise UsageError(f"--drain-seconds must not be negative, got {args.drain_seconds}")
    listen = parse_listen_address(args.listen, option="--listen")
    admin = parse_listen_address(args.admin, option="--admin")
    allow_clients = parse_networks(args.allow_clients, option="--allow-clients")
    users = _users_path(args) if args.users else None
    if not listen.is_loopback and not allow_clients and users is None:
        raise UsageError(
            f"--listen {listen} is reachable from other machines: reshape would be open to "
            "anyone there; require proxy authentication with --users FILE (see `reshape users "
            "add`), or say who may use it with --allow-clients CIDR[,CIDR...] "
            "(e.g. --allow-clients 10.0.0.0/8)"
        )
    if not admin.is_loopback and not allow_clients:
        raise UsageError(
            f"--admin {admin} is reachable from other machines and the admin endpoint has no "
            "authentication (--users does not cover it): keep it on loopback, or say who may "
            "reach it with --allow-clients CIDR[,CIDR...]"
        )
    return RunConfig(
        listen=listen,
        admin=admin,
        policy_path=args.policy,
        confdir=args.confdir.expanduser(),
        upstream_ca=args.upstream_ca,
        workers=args.workers,
        drain_seconds=args.drain_seconds,
        allow_clients=allow_clients,
        request_log=args.request_log,
        users=users,
        client_header_timeout=args.client_header_timeout,
        client_idle_timeout=args.client_idle_timeout,
        origin_connect_timeout=args.origin_connect_timeout,
        origin_read_timeout=args.origin_read_timeout,
        log_level=args.log_level,
        log_format=args.log_format,
        log_requests=args.log_requests,
    )


def _run(args: argparse.Namespace) -> None:
    import uvloop

    from reshape.app.logs import setup_logging

    config = run_config(args)
    setup_logging(config.log_level, config.log_format)
    with _pid_file(args.pid_file):
        if config.workers > 1:
            from reshape.app.supervisor import serve_supervised

            uvloop.run(serve_supervised(config))
        else:
            from reshape.app.serve import serve_single

            uvloop.run(serve_single(config))


@contextlib.contextmanager
def _pid_file(path: Path | None) -> Iterator[None]:
    """This process's id in `path` while the block runs (the supervisor's, with --workers)."""
    if path is None:
        yield
        return
    pid = str(os.getpid())
    try:
        path.write_text(pid + "\n")
    except OSError as e:
        raise UsageError(f"cannot write --pid-file {path}: {e.strerror or e}") from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if path.read_text().strip() == pid:  # not a later instance's
                path.unlink()


def _worker(args: argparse.Namespace) -> None:
    import uvloop

    from reshape.app.logs import setup_logging
    from reshape.app.serve import serve_worker, worker_config

    config = worker_config()
    setup_logging(config.log_level, config.log_format)
    uvloop.run(serve_worker(args.index, config))


def _health(args: argparse.Namespace) -> None:
    import urllib.error
    import urllib.request

    admin = parse_listen_address(args.admin, option="--admin")
    if admin.is_wildcard:  # listening everywhere: ask it on loopback
        admin = replace(admin, host="::1" if ":" in admin.host else "127.0.0.1")
    url = f"http://{admin}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            status = response.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ReshapeError(f"unhealthy: cannot reach {url}: {reason}") from None
    if status != 200:
        raise ReshapeError(f"unhealthy: {url} answered {status}")
    print(f"healthy: {url}")


def _ca(args: argparse.Namespace) -> None:
    from reshape.app.authority import init_ca, load_ca, trust_instructions

    confdir = args.confdir.expanduser()
    if args.ca_command == "init":
        ca, created = init_ca(confdir)
        print(f"{'created' if created else 'reusing'} CA {ca.cert_path}")
        print(f"SHA-256 {ca.sha256_fingerprint}")
        return
    ca = load_ca(confdir)
    admin = parse_listen_address(args.admin, option="--admin")
    print(f"certificate: {ca.cert_path}")
    print(f"key:         {ca.key_path} (never share it)")
    print(f"subject:     {ca.subject}")
    print(f"SHA-256:     {ca.sha256_fingerprint}")
    print()
    print(trust_instructions(ca, f"http://{admin}"))


def _policy(args: argparse.Namespace) -> None:
    from reshape.policy.loader import load_policy_file

    policy_file = load_policy_file(args.file)
    print(
        f"{args.file}: ok — default {policy_file.default!r}, {len(policy_file.policies)} policies, "
        f"{len(policy_file.rules)} rules, {len(policy_file.experiments)} experiments"
    )


_DEFAULT_USERS = Path("\0default")  # `--users` without FILE: CONFDIR/users


def _users_path(args: argparse.Namespace) -> Path:
    from reshape.features.proxy_auth.users import default_users_path

    if args.users is None or args.users == _DEFAULT_USERS:
        return default_users_path(args.confdir.expanduser())
    return Path(args.users).expanduser()


def _read_password(from_stdin: bool) -> str:
    import getpass

    if from_stdin:
        return sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not sys.stdin.isatty():
        raise UsageError("stdin is not a terminal: give the password with --password-stdin")
    password = getpass.getpass("Password: ")
    if getpass.getpass("Password again: ") != password:
        raise UsageError("the passwords differ; nothing changed")
    return password


def _users(args: argparse.Namespace) -> None:
    from reshape.features.proxy_auth import users as users_file

    path = _users_path(args)
    if args.users_command == "list":
        users = users_file.load_or_empty(path)
        if users.directory is not None:
            raise UsageError(f"{path} names {users.describe()}: list its users there")
        print("\n".join(sorted(users.hashes)))
        return
    users_file.check_name(args.name)
    users_file.load_or_empty(path).check_writable()  # before asking for a password
    if args.users_command == "add":
        password_hash = users_file.hash_password(_read_password(args.password_stdin))
    with users_file.locked(path):
        current = users_file.load_or_empty(path)
        if args.users_command == "add":
            users_file.save_users(path, current.with_user(args.name, password_hash))
            changed = args.name in current.hashes
            print(f"{'changed the password of' if changed else 'added'} {args.name} in {path}")
        else:
            if args.name not in current.hashes:
                raise UsageError(f"no user {args.name!r} in {path}")
            users_file.save_users(path, current.without_user(args.name))
            print(f"removed {args.name} from {path}")


def _prometheus_headers(args: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    headers = {}
    for text in args.prometheus_header:
        name, sep, value = text.partition(":")
        if not sep or not name.strip() or any(c in text for c in "\r\n"):
            raise UsageError(f"--prometheus-header: expected 'NAME: VALUE', got {name.strip()!r}…")
        headers[name.strip()] = value.strip()
    token = None
    if args.prometheus_token_file is not None:
        try:
            token = args.prometheus_token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or e
            raise UsageError(f"cannot read --prometheus-token-file: {reason}") from None
        if not token or any(c.isspace() for c in token):
            raise UsageError("--prometheus-token-file: expected one token on one line")
    return headers, token


def _write_output(destination: str, text: str) -> None:
    if destination == "-":
        sys.stdout.write(text)
        return
    try:
        Path(destination).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write {destination}: {e.strerror or e}") from None
    print(f"wrote {destination}", file=sys.stderr)


def _report(args: argparse.Namespace) -> None:
    from reshape.report import build_report

    to_stdout = [flag for flag in ("json", "csv") if getattr(args, flag) == "-"]
    if len(to_stdout) > 1:
        raise UsageError("--json and --csv cannot both go to stdout: give one of them a FILE")
    if args.prometheus is None and (args.prometheus_header or args.prometheus_token_file):
        raise UsageError("--prometheus-token-file and --prometheus-header need --prometheus")
    if args.plot is not None and args.plot.exists() and not args.plot.is_dir():
        raise UsageError(f"--plot {args.plot}: not a directory")
    headers, token = _prometheus_headers(args)
    report = build_report(
        args.experiment,
        prometheus=args.prometheus,
        log=args.log,
        since=args.since,
        bearer_token=token,
        headers=headers,
    )
    from reshape.report.charts import write_plots
    from reshape.report.export import csv_text, report_document
    from reshape.report.html import html_report
    from reshape.report.text import text_report

    if not to_stdout:
        print(text_report(report), end="")
    if args.json is not None:
        _write_output(args.json, json.dumps(report_document(report), indent=2) + "\n")
    if args.csv is not None:
        _write_output(args.csv, csv_text(report))
    if args.html is not None:
        _write_output(str(args.html), html_report(report))
    if args.plot is not None:
        try:
            written = write_plots(report, args.plot)
        except OSError as e:
            raise UsageError(f"cannot write the charts to {args.plot}: {e.strerror or e}") from None
        for path in written:
            print(f"wrote {path}", file=sys.stderr if to_stdout else sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {
        "run": _run,
        "health": _health,
        "_worker": _worker,
        "ca": _ca,
        "policy": _policy,
        "report": _report,
        "users": _users,
    }
    try:
        handlers[args.command](args)
    except ReshapeError as e:
        for line in str(e).splitlines():
            print(f"reshape: error: {line}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `reshape ca show | head`
        sys.stderr.close()
        return 0
    except Exception as e:  # a bug: say so in one line; the traceback only on request
        if os.environ.get("RESHAPE_DEBUG"):
            traceback.print_exc()
        print(
            f"reshape: internal error: {type(e).__name__}: {e} "
            "(set RESHAPE_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 70
    return 0


if __name__ == "__main__":
    sys.exit(main())
