"""How big each TLS record of a connection should be: small while it warms up, full ones later.

A receiver can decrypt a TLS record only once all of it has arrived. A full 16 KB record spans a
dozen TCP segments, so on a slow link the first bytes of a page wait for the whole record; a record
that fits one segment is usable as soon as that segment arrives. Servers that care (Google, nghttpx,
H2O, Cloudflare's nginx patch) start each connection with small records and switch to full ones
once the connection has sent enough that the congestion window is open, and go back to small ones
after the connection has been idle.

Sans-IO: the caller says how many plaintext bytes it is about to encrypt and what time it is, and
`RecordSizer.next_sizes` answers with the size of each record to write them in; the caller makes
one TLS write per size (every TLS write of at most 16,384 bytes becomes exactly one record —
neither pyOpenSSL nor `cryptography` exposes `SSL_set_max_send_fragment`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from reshape.policy.schema import TlsRecordKnobs

# The TLS maximum plaintext per record (RFC 8446 section 5.1; RFC 5246 section 6.2.1).
MAX_RECORD_BYTES = 16_384


class RecordSizer:
    """The record sizes of one connection.

    State: plaintext bytes sent since the connection (re)started warming up, and when it last sent.
    While fewer than `warmup_bytes` have been sent, each record carries at most `small_bytes`; after
    that, at most `large_bytes`. A send that comes `idle_reset` seconds or more after the previous
    one starts the warm-up again. Every record but the last of a send is as large as allowed.
    """

    __slots__ = (
        "idle_reset",
        "large_bytes",
        "last_send",
        "sent_bytes",
        "small_bytes",
        "warmup_bytes",
    )

    def __init__(
        self,
        *,
        small_bytes: int,
        warmup_bytes: int,
        idle_reset: float,
        large_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        if not 0 < small_bytes <= large_bytes <= MAX_RECORD_BYTES:
            raise ValueError(
                f"need 0 < small_bytes ({small_bytes}) <= large_bytes ({large_bytes}) "
                f"<= {MAX_RECORD_BYTES}"
            )
        if warmup_bytes < 0 or not idle_reset > 0:
            raise ValueError(
                f"need warmup_bytes >= 0 and idle_reset > 0, got {warmup_bytes} and {idle_reset}"
            )
        self.small_bytes = small_bytes
        self.large_bytes = large_bytes
        self.warmup_bytes = warmup_bytes
        self.idle_reset = idle_reset
        self.sent_bytes = 0  # since the last (re)start of the warm-up
        self.last_send: float | None = None

    @classmethod
    def fixed(cls, record_bytes: int) -> RecordSizer:
        """Every record carries at most `record_bytes`, whatever the connection did before."""
        return cls(
            small_bytes=record_bytes,
            warmup_bytes=0,
            idle_reset=math.inf,
            large_bytes=record_bytes,
        )

    def __repr__(self) -> str:
        return (
            f"RecordSizer(small_bytes={self.small_bytes}, large_bytes={self.large_bytes}, "
            f"warmup_bytes={self.warmup_bytes}, idle_reset={self.idle_reset}, "
            f"sent_bytes={self.sent_bytes})"
        )

    def fresh(self) -> RecordSizer:
        """A sizer with the same settings for another connection, which has sent nothing yet."""
        return RecordSizer(
            small_bytes=self.small_bytes,
            warmup_bytes=self.warmup_bytes,
            idle_reset=self.idle_reset,
            large_bytes=self.large_bytes,
        )

    def next_sizes(self, n_bytes: int, now: float) -> list[int]:
        """Sizes of the records to write `n_bytes` of plaintext in, at time `now` (monotonic
        seconds); they add up to `n_bytes`. Counts the bytes as sent (zero bytes are no send)."""
        if n_bytes <= 0:
            return []
        if self.last_send is not None and now - self.last_send >= self.idle_reset:
            self.sent_bytes = 0
        self.last_send = now
        sizes: list[int] = []
        remaining = n_bytes
        while remaining > 0 and self.sent_bytes < self.warmup_bytes:
            size = min(self.small_bytes, remaining)
            sizes.append(size)
            self.sent_bytes += size
            remaining -= size
        if remaining > 0:
            full, rest = divmod(remaining, self.large_bytes)
            sizes.extend([self.large_bytes] * full)
            if rest:
                sizes.append(rest)
            self.sent_bytes += remaining
        return sizes


def sizer_for(knobs: TlsRecordKnobs | None) -> RecordSizer | None:
    """A fresh sizer for a connection under `knobs`; None when records are left to OpenSSL."""
    if knobs is None or knobs.mode == "off":
        return None
    if knobs.mode == "fixed":
        return RecordSizer.fixed(knobs.fixed_bytes)
    return RecordSizer(
        small_bytes=knobs.small_bytes, warmup_bytes=knobs.warmup_bytes, idle_reset=knobs.idle_reset
    )


def slices(data: bytes, sizes: Sequence[int]) -> Iterator[memoryview]:
    """`data` cut into consecutive pieces of `sizes` (which must add up to its length)."""
    view = memoryview(data)
    offset = 0
    for size in sizes:
        yield view[offset : offset + size]
        offset += size
    if offset != len(data):
        raise ValueError(f"record sizes add up to {offset}, not {len(data)}")


@dataclass(frozen=True)
class SizedRecords:
    """A route's record plan (reshape.upstream.types.RecordPlan): a policy's `tls_records` knobs
    for the engine's connections (`side: both`, mode not `off`)."""

    knobs: TlsRecordKnobs

    def new_sizer(self) -> RecordSizer:
        sizer = sizer_for(self.knobs)
        if sizer is None:
            raise ValueError("records left to OpenSSL have no sizer: use no plan")
        return sizer
