"""TLS record sizes chosen per write on mitmproxy's TLS connections (`tls_records:` policies)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

from mitmproxy import connection
from mitmproxy.proxy.layers import tls
from OpenSSL import SSL

from reshape.features.tls_records.rules import slices
from reshape.mitm.patches.base import Patch, Replacement

# (connection written to, the client connection it belongs to, plaintext bytes) → record sizes,
# or None to leave the write to OpenSSL's full records. Provided by the tls_records addon.
RecordPlanner = Callable[[connection.Connection, connection.Client, int], Sequence[int] | None]


class SizeTlsRecords(Patch):
    """Let `planner` choose the TLS records mitmproxy writes.

    Why: mitmproxy 12.2.3's `TLSLayer.send_data` (proxy/layers/tls.py, inherited by the client and
    the server TLS layers) hands all the plaintext of a write to one `SSL.Connection.sendall`, so
    OpenSSL cuts it into 16 KB records; no hook sees the write, and `SSL_set_max_send_fragment` is
    reachable neither through pyOpenSSL nor through `cryptography` (whose OpenSSL is linked in
    statically). Every SSL write of at most 16 KB becomes one record, so writing the plaintext in
    the slices the planner returns sets the record sizes.
    """

    def __init__(self, planner: RecordPlanner) -> None:
        super().__init__()
        self.planner = planner

    def replacements(self) -> Iterable[Replacement]:
        original = tls.TLSLayer.send_data
        planner = self.planner

        def send_data(self: tls.TLSLayer, data: bytes) -> Generator[Any, Any, None]:
            sizes = planner(self.conn, self.context.client, len(data))
            if sizes is None or len(sizes) < 2:
                return (yield from original(self, data))
            try:
                for piece in slices(data, sizes):
                    self.tls.sendall(piece)
            except (SSL.ZeroReturnError, SSL.SysCallError):
                pass  # as in mitmproxy's own send_data: the peer is gone
            yield from self.tls_interact()

        yield tls.TLSLayer, "send_data", send_data
