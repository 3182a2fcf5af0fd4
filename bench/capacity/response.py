"""What one request on one connection of the bench's browser model gives back, or raises: shared
by its HTTP/1.1 connections (bench/capacity/client.py) and HTTP/2 ones (bench/capacity/http2.py)."""

from __future__ import annotations

from dataclasses import dataclass


class FetchError(Exception):
    """A request failed: no connection, a broken or malformed response."""


class Unanswered(FetchError):
    """Not one byte of a response came back: the request may be sent again."""


@dataclass(frozen=True)
class Response:
    status: int
    size: int  # body bytes
    head_at: float  # when the head had arrived (event loop clock)
    reusable: bool  # the connection may carry another request
    body: bytes  # empty unless asked for
