"""TLS to origins, sans-IO: network bytes in, plaintext out, and the reverse.

The stdlib's `ssl.SSLObject` over memory BIOs, rather than asyncio's built-in TLS, because only
`wrap_bio(session=...)` lets a new connection resume an earlier session (asyncio and uvloop offer
no way to pass one), and because writing plaintext in slices is how record sizes are chosen.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ALPN_H2 = "h2"
ALPN_H1 = "http/1.1"
_READ_SIZE = 256 * 1024


class TlsError(Exception):
    """The handshake failed (e.g. the origin's certificate did not verify) or the peer erred."""


def client_context(trust_bundle: Path | None, alpn: list[str]) -> ssl.SSLContext:
    """A verifying client context offering `alpn`, trusting `trust_bundle` (system store plus
    extra CAs) or the defaults. One context per ALPN set: contexts are shared, so never mutated."""
    context = ssl.create_default_context(cafile=str(trust_bundle) if trust_bundle else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(alpn)
    return context


@dataclass
class SessionCache:
    """The last TLS session per destination, so the next connection skips a full handshake;
    past `limit` destinations, the least recently used goes (an origin in constant use, its
    session first stored long ago, went first)."""

    sessions: dict[object, ssl.SSLSession] = field(default_factory=dict)
    limit: int = 10_000

    def get(self, key: object) -> ssl.SSLSession | None:
        session = self.sessions.pop(key, None)
        if session is not None:
            self.sessions[key] = session  # last: the most recently used
        return session

    def put(self, key: object, session: ssl.SSLSession | None) -> None:
        if session is None:
            return
        self.sessions.pop(key, None)
        if len(self.sessions) >= self.limit:
            self.sessions.pop(next(iter(self.sessions)))
        self.sessions[key] = session


class TlsClient:
    def __init__(
        self,
        context: ssl.SSLContext,
        server_hostname: str,
        *,
        session: ssl.SSLSession | None = None,
    ) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._incoming, self._outgoing, server_hostname=server_hostname, session=session
        )
        self.handshake_done = False
        self.closed = False

    def start(self) -> bytes:
        """The ClientHello, to be written first."""
        self._handshake()
        return self._outgoing.read()

    def _handshake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLCertVerificationError as e:
            raise TlsError(f"certificate verify failed: {e.verify_message}") from None
        except ssl.SSLError as e:
            raise TlsError(f"TLS handshake failed: {e.reason or e}") from None
        self.handshake_done = True

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """Feed network bytes (b"" = EOF). Returns (plaintext, bytes to write to the network)."""
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()
        if not self.handshake_done:
            self._handshake()
            if not self.handshake_done:
                if not data:
                    raise TlsError("connection closed during the TLS handshake")
                return b"", self._outgoing.read()
        chunks = []
        while True:
            try:
                chunk = self._ssl.read(_READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            except ssl.SSLError as e:
                if not data:  # EOF without close_notify: many servers do this; treat as close
                    self.closed = True
                    break
                raise TlsError(f"TLS error: {e.reason or e}") from None
            if not chunk:
                self.closed = True
                break
            chunks.append(chunk)
        return b"".join(chunks), self._outgoing.read()

    def send(self, plaintext: bytes, *, sizes: Sequence[int] | None = None) -> bytes:
        """Encrypt: one TLS record per entry of `sizes` (they add up to the plaintext's length;
        each SSL write of at most 16,384 bytes becomes exactly one record), or OpenSSL's own
        full records."""
        if sizes is None or len(sizes) <= 1:
            self._ssl.write(plaintext)
        else:
            view, offset = memoryview(plaintext), 0
            for size in sizes:
                self._ssl.write(view[offset : offset + size])
                offset += size
            if offset != len(plaintext):
                raise ValueError(f"record sizes add up to {offset}, not {len(plaintext)}")
        return self._outgoing.read()

    def close(self) -> bytes:
        """A close_notify alert, if the session is still up."""
        with contextlib.suppress(ssl.SSLError):
            self._ssl.unwrap()
        return self._outgoing.read()

    @property
    def alpn(self) -> str | None:
        return self._ssl.selected_alpn_protocol()

    @property
    def session(self) -> ssl.SSLSession | None:
        return self._ssl.session

    @property
    def session_reused(self) -> bool:
        return self._ssl.session_reused
