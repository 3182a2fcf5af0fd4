"""A socket's stand-in for the engine's connections in sans-socket tests: an asyncio transport
that keeps every write (reshape/upstream/wire.py's `Wire` writes to it)."""

from __future__ import annotations


class KeptWrites:
    """An asyncio transport that keeps every write, takes each at once, and closes when told."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def get_write_buffer_size(self) -> int:
        return 0  # every write taken at once

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass
