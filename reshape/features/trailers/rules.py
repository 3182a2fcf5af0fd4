"""What happens to a response's trailer fields, decided without I/O (`trailers:` in a policy).

HTTP/1.1 chunked bodies and HTTP/2 streams can end with header fields (a checksum, timing, a
cookie) so a server streaming a generated body need not buffer it to put them first; almost no
browser uses them. This module decides, per response, from the policy's TrailerKnobs and what
the client said about itself:

- `plan_for`: before the body, whether this client gets trailers (FORWARD), gets allowed fields
  moved into the header section (PROMOTE, when the body is held back anyway) or gets none
  (STRIP), and whether reshape adds a Content-Digest trailer of its own.
- `settle`: after the body, which trailer fields go out, which go into the head, and what
  happened (the `action` labels of `reshape_trailers_total`).
- `ContentDigest`: RFC 9530 `Content-Digest: sha-256=:…:`, fed chunk by chunk while streaming.

reshape/features/trailers/addon.py applies these decisions to mitmproxy flows.
"""

from __future__ import annotations

import base64
import enum
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from reshape.policy.schema import FORBIDDEN_TRAILER_FIELDS, TrailerKnobs

Fields = Sequence[tuple[str, str]]

CONTENT_DIGEST = "Content-Digest"
# Values of the `action` label of reshape_trailers_total, in the order they are reported.
ACTIONS = ("forwarded", "stripped", "promoted", "synthesized")


class Delivery(enum.Enum):
    FORWARD = "forward"  # trailers go to the client as trailers
    STRIP = "strip"  # the client gets none
    PROMOTE = "promote"  # allowed fields move into the header section (when the body is held)


def client_carries_trailers(http_version: str) -> bool:
    """Whether the client's protocol has a place for trailers: HTTP/2 and HTTP/3 streams, and
    HTTP/1.1 chunked bodies (HTTP/1.0 has no chunked coding)."""
    return http_version in ("HTTP/1.1", "HTTP/2.0", "HTTP/2", "HTTP/3", "HTTP/3.0")


def client_takes_trailers(http_version: str, te: str) -> bool:
    """Whether the client takes trailers: an HTTP/2 or HTTP/3 client (the protocol delivers them
    whatever the client does with them), or an HTTP/1.1 client whose request said
    `TE: trailers` (RFC 9110 §10.1.4)."""
    if http_version.startswith(("HTTP/2", "HTTP/3")):
        return True
    if http_version != "HTTP/1.1":
        return False
    return any(token.split(";", 1)[0].strip().lower() == "trailers" for token in te.split(","))


@dataclass(frozen=True)
class TrailerPlan:
    """What to do with one response's trailers, decided when its head arrives."""

    delivery: Delivery
    synthesize_digest: bool  # compute a Content-Digest while the body passes and send it


def plan_for(knobs: TrailerKnobs, http_version: str, te: str) -> TrailerPlan:
    """The plan for a response to a client that spoke `http_version` and sent `te` (or "")."""
    takes = client_takes_trailers(http_version, te)
    if knobs.mode == "strip":
        delivery = Delivery.STRIP
    elif knobs.mode == "forward":
        delivery = Delivery.FORWARD if client_carries_trailers(http_version) else Delivery.STRIP
    elif takes:
        delivery = Delivery.FORWARD
    elif knobs.mode == "promote":
        delivery = Delivery.PROMOTE
    else:
        delivery = Delivery.STRIP
    synthesize = delivery is Delivery.FORWARD and "content-digest" in knobs.synthesize
    return TrailerPlan(delivery, synthesize)


def may_promote(knobs: TrailerKnobs, content_length: int | None) -> bool:
    """Whether a body of `content_length` bytes (None: unknown until it ends) may be held back
    to promote its trailers."""
    return content_length is None or content_length <= knobs.max_promote_buffer


@dataclass(frozen=True)
class Settlement:
    """The outcome for one response: `trailers` to send after the body, `promoted` fields to add
    to the header section, and the actions to count (a subset of ACTIONS, in that order)."""

    trailers: tuple[tuple[str, str], ...]
    promoted: tuple[tuple[str, str], ...]
    actions: tuple[str, ...]


def settle(
    plan: TrailerPlan,
    knobs: TrailerKnobs,
    received: Fields,
    *,
    digest: str | None = None,
    can_carry: bool = True,
    held_bytes: int | None = None,
) -> Settlement:
    """Decide the fate of the trailer fields `received` from the origin.

    `digest`: the synthesized Content-Digest value, if one was computed; it replaces any
    Content-Digest the origin sent. `can_carry`: whether the response as framed towards the
    client has room for trailers (an HTTP/1.1 response must be chunked, and not to a HEAD).
    `held_bytes`: the size of the body if it was held back whole (None: it streamed), which
    PROMOTE needs. Forbidden fields (framing, routing, authentication) never go anywhere.
    """
    allowed = [(n, v) for n, v in received if n.lower() not in FORBIDDEN_TRAILER_FIELDS]
    dropped = len(allowed) < len(received)
    if digest is not None:
        allowed = [(n, v) for n, v in allowed if n.lower() != CONTENT_DIGEST.lower()]
    trailers: list[tuple[str, str]] = []
    promoted: list[tuple[str, str]] = []
    forwarded = synthesized = False
    if plan.delivery is Delivery.FORWARD and can_carry:
        trailers = allowed
        forwarded = bool(allowed)
        if digest is not None:
            trailers = [*trailers, (CONTENT_DIGEST, digest)]
            synthesized = True
    elif (
        plan.delivery is Delivery.PROMOTE
        and held_bytes is not None
        and held_bytes <= knobs.max_promote_buffer
    ):
        promotable = {name.lower() for name in knobs.promote_fields}
        promoted = [(n, v) for n, v in allowed if n.lower() in promotable]
        dropped = dropped or len(promoted) < len(allowed)
    else:
        dropped = dropped or bool(allowed)
    flags = {
        "forwarded": forwarded,
        "stripped": dropped,
        "promoted": bool(promoted),
        "synthesized": synthesized,
    }
    return Settlement(
        tuple(trailers), tuple(promoted), tuple(action for action in ACTIONS if flags[action])
    )


class ContentDigest:
    """RFC 9530 Content-Digest (sha-256) of a body fed in pieces; constant memory."""

    __slots__ = ("_hash",)

    def __init__(self, pieces: Iterable[bytes] = ()) -> None:
        self._hash = hashlib.sha256()
        for piece in pieces:
            self._hash.update(piece)

    def update(self, piece: bytes) -> None:
        self._hash.update(piece)

    def value(self) -> str:
        """The field value: `sha-256=:<base64>:` (a structured-field dictionary, RFC 8941)."""
        return f"sha-256=:{base64.b64encode(self._hash.digest()).decode('ascii')}:"
