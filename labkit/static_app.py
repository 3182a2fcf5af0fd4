"""The hypercorn origin's content: an ASGI app serving files from one directory.

Run by `origins.hypercorn_origin` as `labkit.static_app:app_from_environment()`, which reads
the directory from `$RESHAPE_STATIC_ROOT`. Content types come from `CONTENT_TYPES`, the same table
the nginx origin is configured with, so both origins label the same file identically.

Like nginx, a file's response carries `Last-Modified` (its mtime) and an `ETag` of nginx's form,
so a browser may keep it in its cache for a while (a heuristic lifetime: RFC 9111 §4.2.2);
conditional requests are answered in full.

Besides files, a POST to a path under `/echo/` is answered 200 with the request's body, so a page
can make POST requests that succeed (nginx answers POST to a static file with 405).

Both answers carry `Timing-Allow-Origin: *`, as the nginx origin's do, so that a page on another
origin sees their request and response times in Resource Timing.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from pathlib import Path
from typing import Any

ROOT_ENV = "RESHAPE_STATIC_ROOT"
ECHO_PREFIX = "/echo/"

# Bare media types, no charset parameter: nginx adds none by default, and the two origins should
# send byte-identical Content-Type values for the same file.
CONTENT_TYPES: dict[str, str] = {
    ".html": "text/html",
    ".htm": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".json": "application/json",
    ".txt": "text/plain",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".ico": "image/x-icon",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".wasm": "application/wasm",
}
DEFAULT_CONTENT_TYPE = "application/octet-stream"
TIMING_ALLOW_ORIGIN = (b"timing-allow-origin", b"*")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def content_type(path: Path) -> str:
    """The Content-Type both origins send for `path`, by its suffix."""
    return CONTENT_TYPES.get(path.suffix.lower(), DEFAULT_CONTENT_TYPE)


class StaticFiles:
    """Serves GET and HEAD for the files under `root`; a directory means its index.html.

    POST to a path under ECHO_PREFIX answers the request body back, with the request's
    Content-Type; other methods are answered 405.
    """

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _run_lifespan(receive, send)
        elif scope["type"] == "http":
            if scope["method"] == "POST" and scope["path"].startswith(ECHO_PREFIX):
                await _echo(scope, receive, send)
            else:
                await self._respond(scope, send)

    def resolve(self, url_path: str) -> Path | None:
        """The file a request path names, or None if there is none inside `root`."""
        candidate = (self.root / url_path.lstrip("/")).resolve()
        if not candidate.is_relative_to(self.root):
            return None
        if candidate.is_dir():
            candidate = candidate / "index.html"
        return candidate if candidate.is_file() else None

    async def _respond(self, scope: Scope, send: Send) -> None:
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await _send_text(send, 405, "method not allowed\n", [(b"allow", b"GET, HEAD")])
            return
        file = self.resolve(scope["path"])
        if file is None:
            await _send_text(send, 404, "not found\n")
            return
        # Whole-file reads keep Content-Length and body consistent; lab files are small.
        body = file.read_bytes()
        mtime = int(file.stat().st_mtime)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", content_type(file).encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"last-modified", formatdate(mtime, usegmt=True).encode()),
                    (b"etag", b'"%x-%x"' % (mtime, len(body))),
                    TIMING_ALLOW_ORIGIN,
                ],
            }
        )
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


async def _echo(scope: Scope, receive: Receive, send: Send) -> None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    request_type = dict(scope["headers"]).get(b"content-type", DEFAULT_CONTENT_TYPE.encode())
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", request_type),
                (b"content-length", str(len(body)).encode()),
                TIMING_ALLOW_ORIGIN,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_text(
    send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    headers += extra or []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _run_lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def app_from_environment() -> StaticFiles:
    """The app for the directory in `$RESHAPE_STATIC_ROOT` (the hypercorn entry point)."""
    return StaticFiles(Path(os.environ[ROOT_ENV]))
