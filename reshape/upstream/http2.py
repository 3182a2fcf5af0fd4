"""A sans-IO HTTP/2 client codec: requests out as frames, responses in as events.

reshape's upstream engine speaks HTTP/2 to origins through this module, as it speaks HTTP/1.1
through reshape/upstream/http1.py. It does no I/O: `ClientConnection` takes the bytes read from
the origin (`receive_data`, which returns events) and keeps the bytes to write
(`data_to_send`); reshape/upstream/h2.py does the reading, writing and waiting around it.

Why not h2, which did this job before: h2 runs every frame through generic machinery (a frame
object per frame, two state machines with a transition table each, a chain of header-validation
generators, an event object per step), about 110 us of CPU per exchange on the machine of
bench/RESULTS.md for a request head out and a small response in, and h2 was 12-14% of the pooled
proxy's CPU in py-spy's profiles of the lab's app page loads (the engine's connections alone).
This codec does the one role the engine needs (a client that never accepts server push) with
plain attributes and `struct`, and keeps h2's HPACK coders (hpack, with reshape's encoder and
decoder: reshape/upstream/hpack_encoder.py, hpack_decoder.py).

Origins can be hostile, so what they send is checked as RFC 9113 says (frame sizes and types,
stream states, flow control, the response's fields and its declared length), frames that only
make work are counted (floods: see MAX_OWED_CONTROL_FRAMES and the limits after it), and anything
wrong is a `ProtocolError`: a GOAWAY with its error code is queued and the connection must be
closed, as h2 did for the engine — but for what RFC 9113 makes a stream's error, not the
connection's: a malformed response (§8.1.1: a field HTTP/2 forbids, a bad :status, DATA before
the head, a body that does not match its content-length), a WINDOW_UPDATE of 0 or one that
takes a stream's window above 2^31-1 (§6.9, §6.9.1), DATA beyond a stream's window (§6.9.1
allows either; nghttp2 makes it the stream's), a PRIORITY frame of a bad length (§6.3), a
response head larger than this side announced it takes (§10.5.1; the block is still decoded
whole, as the HPACK table is the connection's), and more informational (1xx) responses before
the final one than a request may have (MAX_INTERIM_RESPONSES, and their size).
That stream is reset (PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM),
`StreamReset.reset_here` says why, and the connection goes on serving the other streams (in a
shared pool, other clients' requests). Frames on a stream this side has reset are dropped
(their flow-control bytes given back), as RFC 9113 §5.4.2 allows.

What the engine sends is checked less: the caller gives fields ready to encode
(reshape/upstream/h2.py `outbound_fields`) and sends no more DATA than `send_window_of` allows.
"""

from __future__ import annotations

import collections
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from hpack import HPACKError, OversizedHeaderListError
from hpack.hpack import Encoder

from reshape.upstream.hpack_decoder import HeadDecoder
from reshape.upstream.http1 import MAX_INTERIM_RESPONSES

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
# Flags.
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# Settings (RFC 9113 §6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 1, 2, 3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 4, 5, 6

# Error codes (RFC 9113 §7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
SETTINGS_TIMEOUT, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM = 0x4, 0x5, 0x6, 0x7
CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM = 0x8, 0x9, 0xA, 0xB
ERROR_NAMES = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT",
    0x5: "STREAM_CLOSED",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR",
    0xA: "CONNECT_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
    0xC: "INADEQUATE_SECURITY",
    0xD: "HTTP_1_1_REQUIRED",
}

DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
DEFAULT_FRAME_SIZE = 16_384  # what we accept: our SETTINGS_MAX_FRAME_SIZE is never raised
MAX_FRAME_SIZE_LIMIT = 2**24 - 1
MAX_STREAM_ID = 2**31 - 1
# A response head's HPACK block, CONTINUATIONs included, may be at most this long (the decoded
# list is bounded by the decoder's max_header_list_size, 64 KB, as h2's was; a larger one is
# decoded all the same, its fields discarded, and its stream reset).
MAX_HEADER_BLOCK = 256 * 1024
# Streams this side reset are remembered (their late frames dropped) up to this many.
RESET_MEMORY = 1024
# Floods (the attacks of CVE-2019-9512, -9515, -9518 and CVE-2024-28182, by an origin): each
# is a connection error ENHANCE_YOUR_CALM.
# - Frames an origin makes this side send (PING and SETTINGS acknowledgements, RST_STREAM for
#   frames on closed streams) while it does not read what was sent: past this many since the
#   driver last found everything written taken by the socket (`output_taken`), the origin is
#   making the proxy pile them up in memory. Envoy's `max_outbound_control_frames`, its default.
MAX_OWED_CONTROL_FRAMES = 1000
# - DATA, HEADERS or CONTINUATION frames with nothing in them and not ending the stream, one
#   after another: work for nothing, never bounded by flow control. Netty's default (Envoy's
#   `max_consecutive_inbound_frames_with_empty_payload` is 1): a proxy meets every kind of origin,
#   and a server that writes each empty chunk its application yields is quirky, not hostile.
MAX_EMPTY_FRAMES_IN_A_ROW = 10
# - CONTINUATION frames after one HEADERS frame: nghttp2's limit since 1.61. At the largest frame
#   size the decoder takes (16 KB) that is 144 KB of header block, more than the 64 KB decoded
#   head it takes.
MAX_CONTINUATIONS = 8

_FRAME_HEAD = struct.Struct(">I B I")  # length << 8 | type, flags, stream id (length 24 bits)
_PAIR = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_U32_PAIR = struct.Struct(">II")

# RFC 9113 §8.2.1: a name holds no controls, space, upper case, DEL, non-ASCII byte or colon
# (a pseudo-field's leading one aside, which only :status may be, first); a value no NUL, CR or
# LF and no leading or trailing whitespace.
_NAME_FORBIDDEN = re.compile(rb"[\x00-\x20A-Z:\x7f-\xff]")
_VALUE_FORBIDDEN = re.compile(rb"[\x00\r\n]|^[ \t]|[ \t]$")
# RFC 9113 §8.2.2: fields that only make sense for one HTTP/1.1 connection.
_CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
_STATUS = re.compile(rb"[1-5][0-9][0-9]")

Fields = list[tuple[bytes, bytes]]


class ProtocolError(Exception):
    """The origin broke HTTP/2 (or the caller asked for something it cannot do): a GOAWAY with
    `error_code` is queued when the origin did, and the connection must be closed. `events`:
    what the frames before the broken one said (from `receive_data`), to be handled first: a
    response completed there is the origin's answer, whatever came after it."""

    def __init__(self, message: str, error_code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.events: list[Event] = []


class StreamIdsExhausted(ProtocolError):
    """Every client stream id has been used: open a new connection."""


class _StreamError(Exception):
    """A stream error on `stream_id` (RFC 9113 §5.4.2): this side resets the stream with
    `error_code` and the connection goes on. `flow_controlled`: the bytes of the frame that showed
    it, which no reader will acknowledge."""

    def __init__(
        self, message: str, stream_id: int, error_code: int, flow_controlled: int = 0
    ) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.error_code = error_code
        self.flow_controlled = flow_controlled


class _Malformed(_StreamError):
    """A malformed response on `stream_id` (RFC 9113 §8.1.1): a stream error, PROTOCOL_ERROR."""

    def __init__(self, message: str, stream_id: int, flow_controlled: int = 0) -> None:
        super().__init__(
            f"malformed response from the origin: {message}",
            stream_id,
            PROTOCOL_ERROR,
            flow_controlled,
        )


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"error {code:#x}")


# Events, in the order the frames came.


@dataclass(slots=True)
class ResponseReceived:
    stream_id: int
    status: int
    headers: Fields  # without pseudo-fields
    end_stream: bool


@dataclass(slots=True)
class InformationalResponse:
    stream_id: int
    status: int
    headers: Fields


@dataclass(slots=True)
class DataReceived:
    stream_id: int
    data: bytes
    flow_controlled_length: int  # padding included: what `acknowledge_received_data` gives back


@dataclass(slots=True)
class TrailersReceived:
    stream_id: int
    headers: Fields


@dataclass(slots=True)
class StreamEnded:
    stream_id: int


@dataclass(slots=True)
class StreamReset:
    stream_id: int
    error_code: int
    # Not empty: this side reset the stream for the origin's error on it, and why (a
    # malformed response, a broken WINDOW_UPDATE): the request was answered, if badly. Empty
    # for the one reset this side makes otherwise, STREAM_CLOSED on a stream the origin had
    # already ended (`_stream_for`): its response stands.
    reset_here: str = ""


@dataclass(slots=True)
class WindowUpdated:
    stream_id: int  # 0: the connection's


@dataclass(slots=True)
class SettingsChanged:
    max_concurrent_streams_changed: bool


@dataclass(slots=True)
class ConnectionTerminated:
    """GOAWAY: streams above `last_stream_id` were not processed."""

    error_code: int
    last_stream_id: int
    additional_data: bytes


Event = (
    ResponseReceived
    | InformationalResponse
    | DataReceived
    | TrailersReceived
    | StreamEnded
    | StreamReset
    | WindowUpdated
    | SettingsChanged
    | ConnectionTerminated
)


class _Stream:
    __slots__ = (
        "stream_id",
        "send_window",
        "receive_window",
        "unacknowledged",
        "local_ended",
        "remote_ended",
        "head_received",
        "expected_length",
        "received_length",
        "head_request",
        "status",
        "interims",
        "interim_size",
    )

    def __init__(self, stream_id: int, send_window: int, receive_window: int) -> None:
        self.stream_id = stream_id
        self.send_window = send_window
        self.receive_window = receive_window
        self.unacknowledged = 0
        self.local_ended = False
        self.remote_ended = False
        self.head_received = False
        self.expected_length: int | None = None
        self.received_length = 0
        self.head_request = False
        self.status = 0  # the final response's, once its head has come
        self.interims = 0  # informational responses before the final one
        self.interim_size = 0  # their decoded size, as RFC 7541 §4.1 counts a header list


class ClientConnection:
    """The client end of one HTTP/2 connection (see the module's docstring)."""

    def __init__(
        self,
        *,
        encoder: Encoder,
        decoder: HeadDecoder,
        stream_window: int = DEFAULT_WINDOW,
        connection_window: int = DEFAULT_WINDOW,
        max_concurrent_streams: int = 100,
    ) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self._stream_window = stream_window  # what each stream may receive, as we announce
        self._connection_window = connection_window
        self._local_max_streams = max_concurrent_streams
        self._out: list[bytes] = []
        self._in = bytearray()
        self.streams: dict[int, _Stream] = {}
        self._reset: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._next_stream_id = 1
        self._preface_received = False
        self._continuation: tuple[int, int, bytearray] | None = None  # stream id, flags, block
        self._continuations = 0  # CONTINUATION frames of the header block being received
        self._empty_in_a_row = 0  # see MAX_EMPTY_FRAMES_IN_A_ROW
        self._owed_control = 0  # see MAX_OWED_CONTROL_FRAMES
        self._connection_unacknowledged = 0
        # Our SETTINGS the origin has not acknowledged yet, in order: the cut each makes to the
        # receive windows of the streams open when it was sent (up to the stream id given), due
        # once the origin has it (`set_stream_window`).
        self._settings_unacknowledged: collections.deque[tuple[int, int]] = collections.deque()
        self.receive_window = connection_window
        self.send_window = DEFAULT_WINDOW  # the connection's, as the origin allows
        # The origin's settings.
        self.remote_initial_window = DEFAULT_WINDOW
        self.remote_max_frame_size = DEFAULT_FRAME_SIZE
        self.remote_max_concurrent_streams: int | None = None
        self.closed = False

    # sending

    def initiate(self) -> None:
        """The connection preface: our SETTINGS (no push, our stream window, our stream limit)
        and the connection's window raised to what we announce."""
        settings = b"".join(
            _PAIR.pack(code, value)
            for code, value in (
                (ENABLE_PUSH, 0),
                (INITIAL_WINDOW_SIZE, self._stream_window),
                (MAX_CONCURRENT_STREAMS, self._local_max_streams),
                # What the decoder takes (a larger head resets its stream): said, so that an
                # origin that listens answers otherwise (RFC 9113 §6.5.2; h2 said it too).
                (MAX_HEADER_LIST_SIZE, self.decoder.max_header_list_size),
            )
        )
        self._out.append(PREFACE)
        self._frame(SETTINGS, 0, 0, settings)
        self._settings_unacknowledged.append((0, 0))
        if self._connection_window > DEFAULT_WINDOW:
            self._window_update(0, self._connection_window - DEFAULT_WINDOW)

    @property
    def stream_window(self) -> int:
        """The receive window each stream starts with, as we announce it."""
        return self._stream_window

    def set_stream_window(self, size: int) -> None:
        """Announce `size` as each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE): streams
        opened from now on start with it, and the windows of open streams move by the difference
        (RFC 9113 §6.9.2), which may leave them below zero: the origin sends them nothing more
        until their readers have taken enough. A raise counts at once; a cut once the origin
        acknowledges the setting, as what it sent before reading it was within the old window."""
        if not 0 <= size <= MAX_WINDOW:
            raise ValueError(f"a stream window must be 0 to 2^31-1, not {size}")
        delta = size - self._stream_window
        if not delta or self.closed:
            return
        self._stream_window = size
        self._frame(SETTINGS, 0, 0, _PAIR.pack(INITIAL_WINDOW_SIZE, size))
        if delta > 0:
            for stream in self.streams.values():
                stream.receive_window += delta
            self._settings_unacknowledged.append((0, 0))
        else:
            self._settings_unacknowledged.append((delta, self._next_stream_id - 2))

    def data_to_send(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    def output_taken(self) -> None:
        """The driver found everything it wrote taken by the socket: the origin reads."""
        self._owed_control = 0

    @property
    def open_streams(self) -> int:
        return len(self.streams)

    def may_open_stream(self) -> bool:
        """Whether a new stream stays within the origin's SETTINGS_MAX_CONCURRENT_STREAMS."""
        limit = self.remote_max_concurrent_streams
        return limit is None or len(self.streams) < limit

    def next_stream_id(self) -> int:
        if self._next_stream_id > MAX_STREAM_ID:
            raise StreamIdsExhausted("no stream ids left on this connection")
        return self._next_stream_id

    def send_headers(
        self, stream_id: int, fields: Sequence[tuple[bytes, bytes]], *, end_stream: bool
    ) -> None:
        """A request's head on a new stream (`next_stream_id()`), or its trailers (which end
        it). `fields`: pseudo-fields first, all ready to encode."""
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id != self.next_stream_id():
                raise ProtocolError(f"stream {stream_id} is not the next stream to open")
            if not self.may_open_stream():
                limit = self.remote_max_concurrent_streams
                raise ProtocolError(f"the origin takes at most {limit} streams at once")
            stream = self.streams[stream_id] = _Stream(
                stream_id, self.remote_initial_window, self._stream_window
            )
            stream.head_request = any(n == b":method" and v == b"HEAD" for n, v in fields[:4])
            self._next_stream_id += 2
        elif stream.local_ended:
            raise ProtocolError(f"stream {stream_id} has ended")
        elif not end_stream:
            raise ProtocolError("trailers must end the stream")
        block = self.encoder.encode(fields)
        size = self.remote_max_frame_size
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            self._frame(HEADERS, flags | END_HEADERS, stream_id, block)
        else:
            view = memoryview(block)
            self._frame(HEADERS, flags, stream_id, view[:size])
            view = view[size:]
            while len(view) > size:
                self._frame(CONTINUATION, 0, stream_id, view[:size])
                view = view[size:]
            self._frame(CONTINUATION, END_HEADERS, stream_id, view)
        if end_stream:
            self._local_end(stream)

    def send_window_of(self, stream_id: int) -> int:
        """How much DATA the stream may send now (both windows), at most a frame's worth."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return 0
        return min(stream.send_window, self.send_window, self.remote_max_frame_size)

    def send_data(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_ended:
            raise ProtocolError(f"stream {stream_id} is not open for sending")
        size = len(data)
        # An empty DATA frame (END_STREAM alone) takes no window, even a negative one.
        if size and size > min(stream.send_window, self.send_window, self.remote_max_frame_size):
            raise ProtocolError("DATA beyond the flow-control window or the frame size")
        stream.send_window -= size
        self.send_window -= size
        self._frame(DATA, END_STREAM if end_stream else 0, stream_id, data)
        if end_stream:
            self._local_end(stream)

    def end_stream(self, stream_id: int) -> None:
        self.send_data(stream_id, b"", end_stream=True)

    def reset_stream(self, stream_id: int, error_code: int = CANCEL) -> None:
        """RST_STREAM, if the stream is still open; its late frames are dropped."""
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        self._frame(RST_STREAM, 0, stream_id, _U32.pack(error_code))
        self._remember_reset(stream_id)

    def forget_stream(self, stream_id: int) -> None:
        """Close the stream on this side without a word to the origin (one that a GOAWAY said
        it never processed: a server may refuse frames once it has sent GOAWAY); its late
        frames are dropped."""
        if self.streams.pop(stream_id, None) is not None:
            self._remember_reset(stream_id)

    def acknowledge_received_data(self, size: int, stream_id: int) -> None:
        """`size` bytes of DATA were taken by the reader: give both windows back, in
        WINDOW_UPDATEs once half a window has been taken (as h2 does)."""
        self.acknowledge_connection_data(size)
        self.acknowledge_stream_data(size, stream_id)

    def acknowledge_connection_data(self, size: int) -> None:
        """The connection's window alone (the stream's follows when its reader takes it)."""
        if size <= 0:
            return
        self._connection_unacknowledged += size
        if self._connection_unacknowledged >= self._connection_window // 2 or (
            self.receive_window == 0 and self._connection_unacknowledged > 1024
        ):
            increment = min(
                self._connection_unacknowledged, self._connection_window - self.receive_window
            )
            self._connection_unacknowledged = 0
            if increment > 0:
                self.receive_window += increment
                self._window_update(0, increment)

    def acknowledge_stream_data(self, size: int, stream_id: int) -> None:
        """The stream's window alone (the connection's was given back on arrival)."""
        if size <= 0:
            return
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_ended:
            return  # no point opening the window of a stream the origin has ended
        stream.unacknowledged += size
        if stream.unacknowledged >= self._stream_window // 2 or (
            stream.receive_window == 0 and stream.unacknowledged > 1024
        ):
            increment = min(stream.unacknowledged, self._stream_window - stream.receive_window)
            stream.unacknowledged = 0
            if increment > 0:
                stream.receive_window += increment
                self._window_update(stream_id, increment)

    def close_connection(self, error_code: int = NO_ERROR) -> None:
        """GOAWAY: this side opens no more streams (it processed none of the origin's)."""
        if not self.closed:
            self.closed = True
            self._frame(GOAWAY, 0, 0, _U32_PAIR.pack(0, error_code))

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes | memoryview) -> None:
        self._out.append(_FRAME_HEAD.pack(len(payload) << 8 | kind, flags, stream_id))
        if payload:
            self._out.append(bytes(payload))

    def _answer(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        """A control frame the origin's own frame calls for (see MAX_OWED_CONTROL_FRAMES)."""
        self._owed_control += 1
        if self._owed_control > MAX_OWED_CONTROL_FRAMES:
            raise ProtocolError(
                f"more than {MAX_OWED_CONTROL_FRAMES} PING, SETTINGS or RST_STREAM frames to "
                "answer while the origin reads nothing (a flood)",
                ENHANCE_YOUR_CALM,
            )
        self._frame(kind, flags, stream_id, payload)

    def _remember_reset(self, stream_id: int) -> None:
        """The stream's late frames are dropped from now on (the last RESET_MEMORY such)."""
        self._reset[stream_id] = None
        if len(self._reset) > RESET_MEMORY:
            self._reset.popitem(last=False)

    def _window_update(self, stream_id: int, increment: int) -> None:
        self._frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))

    def _local_end(self, stream: _Stream) -> None:
        stream.local_ended = True
        if stream.remote_ended:
            del self.streams[stream.stream_id]

    def _remote_end(self, stream: _Stream, events: list[Event]) -> None:
        if stream.expected_length is not None and stream.received_length != stream.expected_length:
            raise _Malformed(
                f"stream {stream.stream_id}: {stream.received_length} bytes of body against a "
                f"content-length of {stream.expected_length}",
                stream.stream_id,
            )
        stream.remote_ended = True
        events.append(StreamEnded(stream.stream_id))
        if stream.local_ended:
            del self.streams[stream.stream_id]

    # receiving

    def receive_data(self, data: bytes) -> list[Event]:
        """The events of the frames `data` completes. On ProtocolError a GOAWAY is queued."""
        events: list[Event] = []
        try:
            self._receive(data, events)
        except ProtocolError as e:
            self._frame(GOAWAY, 0, 0, _U32_PAIR.pack(0, e.error_code))
            self.closed = True
            e.events = events
            raise
        except HPACKError as e:
            self._frame(GOAWAY, 0, 0, _U32_PAIR.pack(0, COMPRESSION_ERROR))
            self.closed = True
            error = ProtocolError(f"invalid header block: {e}", COMPRESSION_ERROR)
            error.events = events
            raise error from None
        return events

    def _receive(self, data: bytes, events: list[Event]) -> None:
        buffer = self._in
        if buffer:
            buffer += data
            data = bytes(buffer)
            buffer.clear()
        at = 0
        end = len(data)
        while end - at >= 9:
            length_kind, flags, stream_id = _FRAME_HEAD.unpack_from(data, at)
            length = length_kind >> 8
            if length > DEFAULT_FRAME_SIZE:
                raise ProtocolError(
                    f"a frame of {length} bytes, above the {DEFAULT_FRAME_SIZE} allowed",
                    FRAME_SIZE_ERROR,
                )
            if end - at - 9 < length:
                break
            payload = data[at + 9 : at + 9 + length]
            at += 9 + length
            try:
                self._receive_frame(
                    length_kind & 0xFF, flags, stream_id & MAX_STREAM_ID, payload, events
                )
            except _StreamError as e:
                self._reset_stream(e, events)
        if at < end:
            buffer += data[at:]

    def _receive_frame(
        self, kind: int, flags: int, stream_id: int, payload: bytes, events: list[Event]
    ) -> None:
        if not self._preface_received:
            if kind != SETTINGS or flags & ACK:
                raise ProtocolError("the origin's first frame is not SETTINGS")
            self._preface_received = True
        if kind in (DATA, HEADERS, CONTINUATION):
            if payload or (kind != CONTINUATION and flags & END_STREAM):
                self._empty_in_a_row = 0
            else:
                self._empty_in_a_row += 1
                if self._empty_in_a_row > MAX_EMPTY_FRAMES_IN_A_ROW:
                    raise ProtocolError(
                        "empty DATA, HEADERS or CONTINUATION frames one after another (a flood)",
                        ENHANCE_YOUR_CALM,
                    )
        if self._continuation is not None:
            self._receive_continuation(kind, flags, stream_id, payload, events)
        elif kind == DATA:
            self._receive_data(flags, stream_id, payload, events)
        elif kind == HEADERS:
            self._receive_headers(flags, stream_id, payload, events)
        elif kind == WINDOW_UPDATE:
            self._receive_window_update(stream_id, payload, events)
        elif kind == SETTINGS:
            self._receive_settings(flags, stream_id, payload, events)
        elif kind == RST_STREAM:
            self._receive_rst_stream(stream_id, payload, events)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise ProtocolError(
                    "a PING frame on a stream or not 8 bytes long", FRAME_SIZE_ERROR
                )
            if not flags & ACK:
                self._answer(PING, ACK, 0, payload)
        elif kind == GOAWAY:
            if stream_id or len(payload) < 8:
                raise ProtocolError("a GOAWAY frame on a stream or too short", FRAME_SIZE_ERROR)
            last, code = _U32_PAIR.unpack_from(payload)
            events.append(ConnectionTerminated(code, last & MAX_STREAM_ID, payload[8:]))
        elif kind == PRIORITY:
            if not stream_id:
                raise ProtocolError("a PRIORITY frame on stream 0")
            if len(payload) != 5 and stream_id in self.streams:
                # RFC 9113 §6.3: the stream's error. On a stream not open here it is dropped:
                # RST_STREAM may not go out on an idle stream (§6.4), a closed one needs none.
                raise _StreamError(
                    f"a PRIORITY frame not 5 bytes long from the origin on stream {stream_id}",
                    stream_id,
                    FRAME_SIZE_ERROR,
                )
        elif kind == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE, with push disabled")
        elif kind == CONTINUATION:
            raise ProtocolError("CONTINUATION without HEADERS before it")
        # Other types are extensions: ignored (RFC 9113 §5.5).

    def _reset_stream(self, error: _StreamError, events: list[Event]) -> None:
        """A stream error: RST_STREAM with its code, the stream forgotten (its late frames
        dropped), the frame's bytes given back to the connection."""
        stream_id = error.stream_id
        self._answer(RST_STREAM, 0, stream_id, _U32.pack(error.error_code))
        self._remember_reset(stream_id)
        self.streams.pop(stream_id, None)
        self.acknowledge_connection_data(error.flow_controlled)
        events.append(StreamReset(stream_id, error.error_code, reset_here=str(error)))

    def _stream_for(self, stream_id: int, what: str, events: list[Event]) -> _Stream | None:
        """The open stream a frame from the origin is for; None for a stream this side reset,
        closed both ways, or already ended by the origin (the frame is dropped; the last two
        are reset); a ProtocolError for a stream that cannot exist."""
        stream = self.streams.get(stream_id)
        if stream is not None and not stream.remote_ended:
            return stream
        if stream_id in self._reset:
            return None
        if stream_id == 0:
            raise ProtocolError(f"{what} on stream 0")
        if stream_id % 2 == 0:
            raise ProtocolError(f"{what} on stream {stream_id}, which the origin cannot open")
        if stream_id >= self._next_stream_id:
            raise ProtocolError(f"{what} on stream {stream_id}, never opened")
        # A stream the origin has ended (its request may still be going out), or one closed for
        # good: ended both ways, or reset so long ago that it is no longer remembered. A stream
        # error, not the connection's (RFC 9113 §5.1, §6.1): the frame is dropped, the origin
        # told once, and a stream still open this side closes (its complete response stands).
        self._answer(RST_STREAM, 0, stream_id, _U32.pack(STREAM_CLOSED))
        self._remember_reset(stream_id)
        if stream is not None:
            del self.streams[stream_id]
            events.append(StreamReset(stream_id, STREAM_CLOSED))
        return None

    def _receive_data(
        self, flags: int, stream_id: int, payload: bytes, events: list[Event]
    ) -> None:
        size = len(payload)
        if size > self.receive_window:
            raise ProtocolError("DATA beyond the connection's window", FLOW_CONTROL_ERROR)
        self.receive_window -= size
        stream = self._stream_for(stream_id, "DATA", events)
        if stream is None:
            self.acknowledge_received_data(size, stream_id)  # a reset stream's: given back now
            return
        if size > stream.receive_window:
            # The stream's error, as nghttp2 has it (RFC 9113 §6.9.1 allows either): the other
            # streams on the connection go on.
            raise _StreamError(
                f"DATA from the origin beyond stream {stream_id}'s window",
                stream_id,
                FLOW_CONTROL_ERROR,
                size,
            )
        stream.receive_window -= size
        if not stream.head_received:
            raise _Malformed(f"DATA before a response head on stream {stream_id}", stream_id, size)
        data = _unpad(flags, payload) if flags & PADDED else payload
        stream.received_length += len(data)
        if stream.expected_length is not None and stream.received_length > stream.expected_length:
            raise _Malformed(_body_beyond(stream), stream_id, size)
        if data or size:
            events.append(DataReceived(stream_id, data, size))
        if flags & END_STREAM:
            self._remote_end(stream, events)

    def _receive_headers(
        self, flags: int, stream_id: int, payload: bytes, events: list[Event]
    ) -> None:
        if flags & PADDED:
            payload = _unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ProtocolError("a HEADERS frame too short for its priority", FRAME_SIZE_ERROR)
            payload = payload[5:]
        if flags & END_HEADERS:
            self._head(flags, stream_id, payload, events)
        else:
            self._continuation = (stream_id, flags, bytearray(payload))
            self._continuations = 0

    def _receive_continuation(
        self, kind: int, flags: int, stream_id: int, payload: bytes, events: list[Event]
    ) -> None:
        assert self._continuation is not None
        head_stream, head_flags, block = self._continuation
        if kind != CONTINUATION or stream_id != head_stream:
            raise ProtocolError("a header block interrupted before its end")
        block += payload
        self._continuations += 1
        if self._continuations > MAX_CONTINUATIONS:
            raise ProtocolError(
                f"a header block in more than {MAX_CONTINUATIONS} CONTINUATION frames",
                ENHANCE_YOUR_CALM,
            )
        if len(block) > MAX_HEADER_BLOCK:
            raise ProtocolError("a header block too large", ENHANCE_YOUR_CALM)
        if flags & END_HEADERS:
            self._continuation = None
            self._head(head_flags, head_stream, bytes(block), events)

    def _head(self, flags: int, stream_id: int, block: bytes, events: list[Event]) -> None:
        # Decoded whatever the stream: the HPACK table is the connection's.
        try:
            fields = self.decoder.decode(block, raw=True)
        except OversizedHeaderListError:
            # Over the limit this side announced (SETTINGS_MAX_HEADER_LIST_SIZE): the decoder
            # took the whole block (the table stays the origin's encoder's) and discarded its
            # fields. The response is dropped, its stream alone reset (RFC 9113 §10.5.1).
            if self._stream_for(stream_id, "HEADERS", events) is None:
                return
            raise _StreamError(
                f"a response head larger than {self.decoder.max_header_list_size} bytes "
                f"(decoded) from the origin on stream {stream_id}",
                stream_id,
                PROTOCOL_ERROR,
            ) from None
        stream = self._stream_for(stream_id, "HEADERS", events)
        if stream is None:
            return
        end_stream = bool(flags & END_STREAM)
        if stream.head_received:
            if not end_stream:
                raise _Malformed(f"trailers on stream {stream_id} that do not end it", stream_id)
            events.append(TrailersReceived(stream_id, _regular_fields(fields, stream_id)))
            self._remote_end(stream, events)
            return
        if not fields or fields[0][0] != b":status":
            raise _Malformed(
                f"a response head without :status first on stream {stream_id}", stream_id
            )
        value = fields[0][1]
        if not _STATUS.fullmatch(value):
            raise _Malformed(f"an invalid :status {value!r} on stream {stream_id}", stream_id)
        status = int(value)
        headers = _regular_fields(fields[1:], stream_id)
        if status < 200:
            if end_stream or status == 101:
                raise _Malformed(f"an invalid {status} response on stream {stream_id}", stream_id)
            self._count_interim(stream, fields)
            events.append(InformationalResponse(stream_id, status, headers))
            return
        stream.head_received = True
        stream.status = status
        if stream.head_request or status in (204, 304):
            # No content (RFC 9110 §6.4.1, §9.3.2), whatever its content-length says: that is
            # the unsent representation's (304, HEAD) or a server's mistake (204) that RFC 9113
            # §8.1.1 lets pass. DATA with content in it is a malformed response: relayed to an
            # HTTP/1.1 client, it would be read as the answer to its next request.
            stream.expected_length = 0
        else:
            for name, field_value in headers:
                if name == b"content-length":
                    if (
                        not field_value.isdigit()
                        or len(field_value) > 18
                        or (
                            stream.expected_length is not None
                            and stream.expected_length != int(field_value)
                        )
                    ):
                        raise _Malformed(
                            f"an invalid content-length {field_value!r} on stream {stream_id}",
                            stream_id,
                        )
                    stream.expected_length = int(field_value)
        events.append(ResponseReceived(stream_id, status, headers, end_stream))
        if end_stream:
            self._remote_end(stream, events)

    def _count_interim(self, stream: _Stream, fields: Sequence[tuple[bytes, bytes]]) -> None:
        """One more informational response on `stream`: past MAX_INTERIM_RESPONSES (http1.py
        says why that many), or past the size one head may have all together (each is under it
        by itself, but many add up; Go's transport bounds their sum so), the stream is reset
        with ENHANCE_YOUR_CALM, the origin's making work for nothing (RFC 9113 §7), and the
        connection goes on."""
        stream.interims += 1
        stream.interim_size += sum(len(name) + len(value) + 32 for name, value in fields)
        limit = self.decoder.max_header_list_size
        if stream.interims > MAX_INTERIM_RESPONSES:
            what = f"more than {MAX_INTERIM_RESPONSES} informational (1xx) responses to one request"
        elif stream.interim_size > limit:
            what = (
                f"informational (1xx) responses to one request larger than {limit} bytes "
                "together (decoded)"
            )
        else:
            return
        raise _StreamError(
            f"{what} from the origin on stream {stream.stream_id}",
            stream.stream_id,
            ENHANCE_YOUR_CALM,
        )

    def _receive_window_update(self, stream_id: int, payload: bytes, events: list[Event]) -> None:
        """RFC 9113 §6.9: an increment of 0 or a window above 2^31-1 is the connection's error
        on stream 0 and the stream's error (RST_STREAM) on a stream; a WINDOW_UPDATE on a stream
        that has ended or that this side reset is no error (the origin may send it after its
        END_STREAM) and is dropped; on a stream never opened (idle, §5.1) it is the
        connection's error, as nghttp2 has it."""
        if len(payload) != 4:
            raise ProtocolError("a WINDOW_UPDATE frame not 4 bytes long", FRAME_SIZE_ERROR)
        increment = _U32.unpack(payload)[0] & MAX_WINDOW
        if stream_id == 0:
            if not increment:
                raise ProtocolError("a WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ProtocolError("the connection's window above 2^31-1", FLOW_CONTROL_ERROR)
            events.append(WindowUpdated(0))
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id % 2 == 0 or stream_id >= self._next_stream_id:
                raise ProtocolError(f"WINDOW_UPDATE on stream {stream_id}, never opened")
            return  # a stream that has ended, or that this side reset: nothing to send on it
        if not increment:
            raise _StreamError(
                f"a WINDOW_UPDATE of 0 from the origin on stream {stream_id}",
                stream_id,
                PROTOCOL_ERROR,
            )
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise _StreamError(
                f"the origin took stream {stream_id}'s window above 2^31-1",
                stream_id,
                FLOW_CONTROL_ERROR,
            )
        events.append(WindowUpdated(stream_id))

    def _receive_settings(
        self, flags: int, stream_id: int, payload: bytes, events: list[Event]
    ) -> None:
        if stream_id:
            raise ProtocolError("a SETTINGS frame on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError("a SETTINGS acknowledgement with a payload", FRAME_SIZE_ERROR)
            if self._settings_unacknowledged:
                cut, last_stream_id = self._settings_unacknowledged.popleft()
                for stream in self.streams.values():
                    if stream.stream_id <= last_stream_id:
                        stream.receive_window += cut
            return
        if len(payload) % 6:
            raise ProtocolError("a SETTINGS frame not a multiple of 6 bytes", FRAME_SIZE_ERROR)
        streams_changed = False
        for at in range(0, len(payload), 6):
            code, value = _PAIR.unpack_from(payload, at)
            if code == HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value
            elif code == ENABLE_PUSH:
                if value != 0:
                    raise ProtocolError(f"SETTINGS_ENABLE_PUSH {value} from a server")
            elif code == MAX_CONCURRENT_STREAMS:
                streams_changed = streams_changed or value != self.remote_max_concurrent_streams
                self.remote_max_concurrent_streams = value
            elif code == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(
                        "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1", FLOW_CONTROL_ERROR
                    )
                delta = value - self.remote_initial_window
                self.remote_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ProtocolError("a stream's window above 2^31-1", FLOW_CONTROL_ERROR)
            elif code == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT:
                    raise ProtocolError(f"an invalid SETTINGS_MAX_FRAME_SIZE {value}")
                self.remote_max_frame_size = value
            # MAX_HEADER_LIST_SIZE is advisory; unknown settings are ignored (§6.5.2).
        self._answer(SETTINGS, ACK, 0, b"")
        events.append(SettingsChanged(streams_changed))

    def _receive_rst_stream(self, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise ProtocolError("a RST_STREAM frame not 4 bytes long", FRAME_SIZE_ERROR)
        if stream_id == 0:
            raise ProtocolError("RST_STREAM on stream 0")
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            if stream_id >= self._next_stream_id or stream_id % 2 == 0:
                raise ProtocolError(f"RST_STREAM on stream {stream_id}, never opened")
            return  # ended or reset already
        self._remember_reset(stream_id)
        events.append(StreamReset(stream_id, _U32.unpack(payload)[0]))


def _body_beyond(stream: _Stream) -> str:
    """What is wrong with a body longer than its stream's response allows."""
    if stream.head_request:
        return f"stream {stream.stream_id}: a body in the response to HEAD, which has none"
    if stream.status in (204, 304):
        return f"stream {stream.stream_id}: a body in a {stream.status} response, which has none"
    return (
        f"stream {stream.stream_id}: more body than its content-length of {stream.expected_length}"
    )


def _unpad(flags: int, payload: bytes) -> bytes:
    if not payload:
        raise ProtocolError("a padded frame without its pad length", FRAME_SIZE_ERROR)
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolError("padding as long as the frame")
    return payload[1 : len(payload) - pad]


def _regular_fields(fields: Sequence[tuple[bytes, bytes]], stream_id: int) -> Fields:
    """A response head's or trailers' fields but the first pseudo-field, checked as RFC 9113
    §8.2 and §8.3 say; the stream's response is malformed if any is not valid."""
    checked: Fields = []
    for name, value in fields:
        if not name or _NAME_FORBIDDEN.search(name):
            raise _Malformed(f"an invalid field name {name!r} on stream {stream_id}", stream_id)
        if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            raise _Malformed(
                f"a connection-specific field {name!r} on stream {stream_id}", stream_id
            )
        if value and _VALUE_FORBIDDEN.search(value):
            raise _Malformed(f"an invalid value in {name!r} on stream {stream_id}", stream_id)
        checked.append((name, value))
    return checked
