"""The policy file's schema, defined once, in typed code.

Each class is one mapping in the YAML file; each `knob()` is one key, with its type, default and
meaning. policies/README.md documents every key (a test checks it against these classes).
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from reshape.policy.decode import knob


def _cidr(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"expected a CIDR network such as 10.0.0.0/8, got {value!r}"
    return None


def _glob(value: str) -> str | None:
    return None if value else "expected a non-empty glob pattern"


def label_problem(value: str) -> str | None:
    """An experiment's or an arm's name: the `arm` label is `experiment:arm`, so a colon in
    either would make two experiments' labels one."""
    if not value:
        return "expected a non-empty name"
    return (
        f"must not contain ':' (the arm label is experiment:arm), got {value!r}"
        if ":" in value
        else None
    )


@dataclass(frozen=True)
class UpstreamKnobs:
    """The shared pool of origin connections (reshape/upstream/)."""

    max_connections_per_host: int = knob(
        6,
        doc="Connections to one origin (scheme, host, port, TLS name), all clients and all "
        "workers together.",
        minimum=1,
        maximum=1000,
    )
    max_connections_per_client: int = knob(
        0,
        doc="0: max_connections_per_host is the cap for all clients together. n: a connection "
        "to an origin opens only while there are fewer than n per client (client address) with "
        "requests for it, as each browser would on its own, within max_connections_per_host; "
        "idle connections are shared all the same. Policies without `upstream:` have 6.",
        minimum=0,
        maximum=1000,
    )
    max_queue: int = knob(
        1000,
        doc="Requests that may wait for a connection per origin; beyond it: 503.",
        minimum=0,
    )
    queue_timeout: float = knob(
        30.0, doc="Seconds a request may wait for a connection; beyond it: 503.", minimum=0.001
    )
    idle_timeout: float = knob(
        60.0,
        doc="Seconds an idle keep-alive connection to an origin is kept (less when an HTTP/1.1 "
        "origin states a shorter keep-alive timeout: closed a second before it).",
        minimum=0.001,
    )
    http2: bool = knob(True, doc="Use HTTP/2 where the origin offers it by ALPN.")
    share: bool = knob(
        True,
        doc="Share connections among all clients (one pool per origin); false: each client "
        "connection keeps its own, closed when it closes, as a browser without a proxy would "
        "(to measure the pool against no pool in an experiment).",
    )
    pipeline_depth: int = knob(
        0,
        doc="HTTP/1.1 pipelining: most requests in flight on one connection (0 = off).",
        minimum=0,
        maximum=64,
    )
    pipeline_stall_timeout: float = knob(
        2.0,
        doc="Seconds requests pipelined behind a response wait while it makes no progress; "
        "then they go again on other connections, and this one closes after that response.",
        minimum=0.001,
    )
    connect_timeout: float = knob(
        10.0, doc="Seconds to open a connection (TCP and TLS) to an origin.", minimum=0.001
    )
    read_timeout: float = knob(
        60.0,
        doc="Seconds an origin may stay silent once it has the whole request: before the "
        "response head (then 504; an informational 1xx response, such as 102 Processing, "
        "is not silence), or between body bytes (then the response is cut off). "
        "While a streamed request body goes out (an upload, a gRPC stream), the time spent "
        "waiting for the client's next piece of it is not counted (the origin may be waiting "
        "for it too); waiting for the origin to take the body is.",
        minimum=0.001,
    )


@dataclass(frozen=True)
class TlsRecordKnobs:
    """Sizes of the TLS records reshape writes (reshape/features/tls_records/rules.py)."""

    mode: Literal["off", "dynamic", "fixed"] = knob(
        "dynamic",
        doc="dynamic: small records while a connection warms up and after it idled, full 16 KB "
        "ones otherwise; fixed: every record at most fixed_bytes; off: OpenSSL's 16 KB records.",
    )
    small_bytes: int = knob(
        1400,
        doc="Plaintext bytes per record while a connection warms up (dynamic): one TCP segment.",
        minimum=512,
        maximum=16384,
    )
    warmup_bytes: int = knob(
        1_048_576,
        doc="Bytes a connection sends in small records before it switches to full ones (dynamic).",
        minimum=0,
    )
    idle_reset: float = knob(
        1.0,
        doc="Seconds without sending after which a connection warms up again (dynamic).",
        minimum=0.001,
    )
    fixed_bytes: int = knob(
        4096, doc="Plaintext bytes per record in mode fixed.", minimum=512, maximum=16384
    )
    side: Literal["client", "both"] = knob(
        "client", doc="client: records to browsers; both: also records to origins."
    )


# Header fields that frame, route or authenticate a message: never taken from a trailer section
# (RFC 9110 section 6.5.1), neither forwarded nor promoted. Lower case.
FORBIDDEN_TRAILER_FIELDS = frozenset(
    {
        "authorization",
        "cache-control",
        "connection",
        "content-encoding",
        "content-length",
        "content-range",
        "content-type",
        "expect",
        "host",
        "keep-alive",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "range",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "www-authenticate",
    }
)


def _trailer_field(value: str) -> str | None:
    name = value.lower()
    if not name or any(c in name for c in " \t:\r\n"):
        return f"expected a header field name such as Server-Timing, got {value!r}"
    if name in FORBIDDEN_TRAILER_FIELDS:
        return f"{value} frames, routes or authenticates a message: never taken from trailers"
    return None


def _trailer_fields(values: tuple[str, ...]) -> str | None:
    return next((problem for v in values if (problem := _trailer_field(v))), None)


@dataclass(frozen=True)
class TrailerKnobs:
    """Header fields sent after the body (HTTP/1.1 chunked trailers, HTTP/2 trailing HEADERS)."""

    mode: Literal["auto", "forward", "strip", "promote"] = knob(
        "auto",
        doc="auto: forward to clients that take trailers (HTTP/2 clients, HTTP/1.1 clients that "
        "sent TE: trailers), strip for the rest; forward: to every client that can carry them; "
        "strip: to none; promote: like auto, but for clients that cannot take trailers move "
        "promote_fields into the header section (buffering bodies up to max_promote_buffer).",
    )
    promote_fields: tuple[str, ...] = knob(
        ("Server-Timing", "Content-Digest"),
        doc="Trailer fields that may move into the header section (mode promote); case-"
        "insensitive.",
        check=_trailer_fields,
    )
    max_promote_buffer: int = knob(
        1_048_576,
        doc="Largest body buffered to promote its trailers; a larger one streams and its "
        "trailers are stripped (and counted).",
        minimum=0,
    )
    synthesize: tuple[Literal["content-digest"], ...] = knob(
        (),
        doc="Trailers reshape computes while streaming and sends to clients that take trailers: "
        "content-digest (RFC 9530, sha-256 of the body as sent).",
    )


@dataclass(frozen=True)
class PreconnectKnobs:
    """Warm connections to origins a page is expected to need (in the shared pool)."""

    mode: Literal["off", "static", "learned"] = knob(
        "off",
        doc="static: static_connections to every origin on first sight (like IE9); learned: "
        "to the origins earlier loads of the same first-party origin needed.",
    )
    static_connections: int = knob(
        2, doc="Connections opened per origin in mode static.", minimum=1, maximum=64
    )
    min_confidence: float = knob(
        0.75,
        doc="Preconnect to a learned origin when hits / (hits + misses) exceeds this.",
        minimum=0.0,
        maximum=1.0,
    )
    max_misses: int = knob(
        3,
        doc="A learned origin is forgotten after this many page loads in a row that did not "
        "need it.",
        minimum=1,
    )
    max_connections_per_origin: int = knob(
        2,
        doc="Most warm connections opened to one origin per page load (also capped by "
        "upstream.max_connections_per_host).",
        minimum=1,
        maximum=64,
    )
    rule: Literal["history", "half_resources"] = knob(
        "history",
        doc="history: as many connections as the origin needed before (at most "
        "max_connections_per_origin); half_resources: ceil(R/2) for R expected resources.",
    )
    idle_timeout: float = knob(
        10.0, doc="Seconds an unused warm connection is kept before it closes.", minimum=0.001
    )


@dataclass(frozen=True)
class EarlyHintsKnobs:
    """Answer a page's document request at once with a 103 Early Hints response naming what
    earlier loads of the page needed, so the browser fetches and connects while the origin
    still works on the HTML (HTTP/2 clients; learned from every client of the process)."""

    mode: Literal["off", "learned"] = knob(
        "off",
        doc="learned: preload the page's own stylesheets, scripts and fonts, and preconnect to "
        "the other origins it used, as earlier loads of the same document URL requested them.",
    )
    min_loads: int = knob(
        2,
        doc="A resource or origin is hinted once this many loads of the page needed it.",
        minimum=1,
        maximum=100,
    )
    max_misses: int = knob(
        2,
        doc="A learned resource or origin is forgotten after this many loads in a row that did "
        "not need it.",
        minimum=1,
    )
    max_preloads: int = knob(8, doc="Most resources one 103 preloads.", minimum=0, maximum=64)
    max_preconnects: int = knob(
        4, doc="Most origins one 103 preconnects to.", minimum=0, maximum=64
    )
    verify_every: int = knob(
        10,
        doc="Every this many loads of a page that a 103 would preload for, one gets no "
        "preloads: what the page still needs is learned from it (the browser fetches what a "
        "103 preloads whether or not the page still uses it).",
        minimum=2,
    )


@dataclass(frozen=True)
class DestinationKnobs:
    """Which destination addresses clients may reach through the proxy."""

    private: Literal["allow", "deny"] = knob(
        "allow",
        doc="Private and other addresses the special-purpose registries call not globally "
        "reachable (10/8, 172.16/12, 192.168/16, 100.64/10, 198.18/15, 240/4, fc00::/7, ...).",
    )
    link_local: Literal["allow", "deny"] = knob(
        "deny",
        doc="Link-local and cloud metadata addresses (169.254/16, fe80::/10, fd00:ec2::254).",
    )
    loopback: Literal["allow", "deny"] = knob(
        "allow",
        doc="Loopback addresses (127/8, ::1, 0/8, ::). The proxy's own listen and admin "
        "addresses are refused whatever this says.",
    )


@dataclass(frozen=True)
class Policy:
    """A named bundle of knobs; an empty mapping `{}` means plain proxying."""

    upstream: UpstreamKnobs | None = knob(
        None,
        doc="Route requests through reshape's shared pool (absent: mitmproxy's own connections).",
    )
    tls_records: TlsRecordKnobs | None = knob(
        None,
        doc="Size the TLS records of each connection (absent: OpenSSL's 16 KB records).",
    )
    trailers: TrailerKnobs = knob(
        default_factory=TrailerKnobs,
        doc="What happens to trailer fields (absent: mode auto).",
    )
    preconnect: PreconnectKnobs = knob(
        default_factory=PreconnectKnobs,
        doc="Warm origin connections before requests need them (needs upstream; absent: off).",
    )
    early_hints: EarlyHintsKnobs = knob(
        default_factory=EarlyHintsKnobs,
        doc="Tell the browser in a 103 what a page will need (absent: off).",
    )
    destinations: DestinationKnobs = knob(
        default_factory=DestinationKnobs,
        doc="Destination addresses clients may reach (absent: the defaults below).",
    )


@dataclass(frozen=True)
class RuleMatch:
    """Conditions of a rule; every key given must match."""

    client: str | None = knob(
        None, doc="Client address network (CIDR), e.g. 10.0.0.0/8.", check=_cidr
    )
    user_agent: str | None = knob(
        None, doc="Glob on the request's User-Agent, e.g. '*Firefox/*'.", check=_glob
    )
    destination: str | None = knob(
        None, doc="Glob on the destination host name, e.g. '*.example.com'.", check=_glob
    )

    def matches(self, client_ip: str, user_agent: str, destination: str) -> bool:
        if self.client is not None:
            try:
                address = ipaddress.ip_address(client_ip.removeprefix("::ffff:"))
            except ValueError:
                return False
            if address not in ipaddress.ip_network(self.client, strict=False):
                return False
        if self.user_agent is not None and not fnmatch.fnmatchcase(user_agent, self.user_agent):
            return False
        return self.destination is None or fnmatch.fnmatchcase(
            destination.lower(), self.destination.lower()
        )


@dataclass(frozen=True)
class Rule:
    """Selects `policy` for requests that match; the first matching rule wins."""

    match: RuleMatch = knob(doc="The conditions (client, user_agent, destination).")
    policy: str = knob(doc="Name of a policy under `policies`.")


def _unit(value: str) -> str | None:
    if value in ("client_ip", "cookie") or (
        value.startswith("header:") and len(value) > len("header:")
    ):
        return None
    return f"expected client_ip, header:NAME or cookie, got {value!r}"


@dataclass(frozen=True)
class Arm:
    """One arm of an experiment."""

    policy: str = knob(doc="Name of a policy under `policies`.")
    # (A bound: the assignment hash has 64 bits; past them a weight split units wrongly.)
    weight: int = knob(
        doc="Relative share of units assigned to this arm.", minimum=0, maximum=1_000_000
    )


@dataclass(frozen=True)
class Experiment:
    """An A/B experiment: units (clients) are assigned to arms by a salted hash."""

    name: str = knob(
        doc="Experiment name; becomes part of the `arm` metric label (`name:arm`).",
        check=label_problem,
    )
    unit: str = knob(
        doc="What is assigned to an arm: client_ip, header:NAME (a request header's value), or "
        "cookie (a cookie reshape sets itself).",
        check=_unit,
    )
    arms: Mapping[str, Arm] = knob(doc="Arms by name, each with a policy and a weight.")
    salt: str = knob("", doc="Changes the assignment without renaming the experiment.")
    match: RuleMatch | None = knob(
        None, doc="Limit the experiment to matching requests (same keys as a rule's match)."
    )


@dataclass(frozen=True)
class PolicyFile:
    """The whole file."""

    version: Literal[1] = knob(doc="Schema version; must be 1.")
    default: str = knob(doc="The policy used when no rule or experiment applies.")
    policies: Mapping[str, Policy] = knob(doc="Named bundles of knobs.")
    rules: tuple[Rule, ...] = knob(
        default_factory=tuple, doc="Ordered rules choosing a policy per request."
    )
    experiments: tuple[Experiment, ...] = knob(
        default_factory=tuple,
        doc="A/B experiments; the first one whose `match` applies assigns an arm.",
    )
