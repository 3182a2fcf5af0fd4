"""reshape/mitm/patches/h2_frame_trace.py `receive_frame_untraced`: h2's frame handling, the
same events and frames out, without the trace message unless a logger would write it."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from h2.errors import ErrorCodes
from hyperframe.frame import DataFrame, Frame, HeadersFrame

from reshape.mitm.patches import Patches
from reshape.mitm.patches.h2_frame_trace import ReceiveFramesUntraced, receive_frame_untraced


class Untraced(h2.connection.H2Connection):
    _receive_frame = receive_frame_untraced


def _pair(server_class: type[h2.connection.H2Connection], logger: Any = None) -> tuple[Any, Any]:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    config = h2.config.H2Configuration(client_side=False)
    if logger is not None:
        config.logger = logger
    server = server_class(config)
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    return client, server


def _script(server_class: type[h2.connection.H2Connection]) -> list[object]:
    """A request, data on a stream the server has reset (a stream error: RST_STREAM), data on a
    stream the client ended and headers on a stream implicitly closed (connection errors): what
    the server says and sends after each."""
    client, server = _pair(server_class)
    seen: list[object] = []

    def deliver(data: bytes) -> None:
        try:
            events = server.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            seen.append((type(e).__name__, str(e)))
        else:
            seen.append([type(e).__name__ for e in events])
        seen.append(server.data_to_send())

    head = [(":method", "POST"), (":scheme", "https"), (":authority", "a"), (":path", "/")]
    client.send_headers(1, head)
    client.send_data(1, b"x" * 100)
    client.send_headers(3, head, end_stream=True)
    client.send_headers(7, head, end_stream=True)
    deliver(client.data_to_send())
    server.reset_stream(1, ErrorCodes.CANCEL)
    server.data_to_send()
    deliver(DataFrame(1, b"more").serialize())  # reset by the server: RST_STREAM
    deliver(DataFrame(3, b"after the end").serialize())  # ended by the client: an error
    deliver(HeadersFrame(5, b"\x82", flags=["END_HEADERS"]).serialize())  # below 7, never opened
    # A new stream makes h2 forget the closed ones; then a HEADERS frame on the reset stream 1
    # (a stream error, RST_STREAM STREAM_CLOSED).
    client, server = _pair(server_class)
    client.send_headers(1, head)
    deliver(client.data_to_send())
    server.reset_stream(1, ErrorCodes.CANCEL)
    server.data_to_send()
    client.send_headers(9, head, end_stream=True)
    deliver(client.data_to_send())
    deliver(HeadersFrame(1, b"\x82", flags=["END_HEADERS", "END_STREAM"]).serialize())
    return seen


def test_frames_are_handled_as_h2_handles_them() -> None:
    assert _script(Untraced) == _script(h2.connection.H2Connection)


class Recording(h2.config.DummyLogger):
    def __init__(self) -> None:
        super().__init__()
        self.traced: list[str] = []

    def trace(self, fmtstr: str, *args: Any) -> None:
        self.traced.append(fmtstr % args)


def test_the_trace_message_is_made_only_for_a_logger_that_writes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Frame] = []
    original = Frame.__repr__

    def counting(frame: Frame) -> str:
        made.append(frame)
        return original(frame)

    monkeypatch.setattr(Frame, "__repr__", counting)
    client, server = _pair(Untraced)
    head = [(":method", "GET"), (":scheme", "https"), (":authority", "a"), (":path", "/")]
    client.send_headers(1, head, end_stream=True)
    data = client.data_to_send()
    made.clear()  # the client's own (h2's) frames
    server.receive_data(data)
    assert made == []
    recording = Recording()
    client, server = _pair(Untraced, recording)
    assert any(message.startswith("Received frame: SettingsFrame") for message in recording.traced)
    assert made


def test_the_patch_puts_it_on_mitmproxys_connections() -> None:
    from mitmproxy.proxy.layers.http._http_h2 import BufferedH2Connection

    original = BufferedH2Connection._receive_frame
    with Patches([ReceiveFramesUntraced()]):
        assert BufferedH2Connection._receive_frame is receive_frame_untraced
    assert BufferedH2Connection._receive_frame is original


def test_an_h2_release_it_was_not_checked_on_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from mitmproxy.proxy.layers.http._http_h2 import BufferedH2Connection

    from reshape.mitm.patches import PatchError

    original = BufferedH2Connection._receive_frame
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.9")
    with pytest.raises(PatchError, match="checked on h2 4.3.0, not 9.9.9"):
        ReceiveFramesUntraced().install()
    assert BufferedH2Connection._receive_frame is original
