"""A Node.js HTTP/1.1 origin (`node:http`, Node's own server, as Express apps run on), whose
connections are logged: when each opened, which requests it carried, and whether its client
closed it (its FIN came) before the server did.

Node states its keep-alive terms in every response that keeps the connection: `Keep-Alive:
timeout=<keepAliveTimeout in whole seconds>`, and `, max=<maxRequestsPerSocket>` when that is
set (the total, repeated; answered requests past it get a 503). Node 20 closes an idle
connection a second after the timeout it states.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from labkit import processes

SERVER = r"""
const http = require('node:http');
const fs = require('node:fs');
const [host, port, keepAliveMs, maxRequests, logPath] = process.argv.slice(2);
const log = (entry) => fs.appendFileSync(logPath, JSON.stringify(entry) + '\n');
const server = http.createServer((req, res) => {
  let size = 0;
  req.on('data', (chunk) => { size += chunk.length; });
  req.on('end', () => {
    log({event: 'request', conn: req.socket.logId, method: req.method, url: req.url, size});
    res.setHeader('Content-Type', 'text/plain');
    res.end(`${req.method} ${req.url} ${size}\n`);
  });
});
server.keepAliveTimeout = Number(keepAliveMs);
server.maxRequestsPerSocket = Number(maxRequests);
let opened = 0;
server.on('connection', (socket) => {
  socket.logId = ++opened;
  log({event: 'open', conn: socket.logId});
  socket.on('end', () => log({event: 'client closed', conn: socket.logId}));
  socket.on('close', () => log({event: 'closed', conn: socket.logId}));
});
server.listen(Number(port), host);
"""


@dataclass
class NodeConnection:
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, url) in order
    client_closed: bool = False  # its client's FIN came before it closed
    closed: bool = False


@dataclass(frozen=True)
class NodeOrigin:
    host: str
    port: int
    log: Path

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def connections(self) -> list[NodeConnection]:
        """Each connection the server accepted that carried a request, in order (the start's
        readiness probe carried none)."""
        conns: dict[int, NodeConnection] = {}
        for line in self.log.read_text().splitlines():
            entry = json.loads(line)
            conn = conns.setdefault(entry["conn"], NodeConnection())
            if entry["event"] == "request":
                conn.requests.append((entry["method"], entry["url"]))
            elif entry["event"] == "client closed":
                conn.client_closed = not conn.closed
            elif entry["event"] == "closed":
                conn.closed = True
        return [conns[n] for n in sorted(conns) if conns[n].requests]


@contextmanager
def node_origin(
    workdir: Path,
    host: str = "127.0.0.1",
    *,
    keep_alive_timeout: float = 5.0,
    max_requests_per_socket: int = 0,
) -> Iterator[NodeOrigin]:
    """Node's HTTP server on `host`, answering every request with its method, path and body
    size; `keep_alive_timeout` in seconds (Node's default 5), `max_requests_per_socket` 0: no
    limit (Node's default)."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "node_origin.js"
    script.write_text(SERVER)
    log = workdir / "connections.jsonl"
    log.write_text("")
    port = processes.free_port(host)
    argv = [
        "node",
        str(script),
        host,
        str(port),
        str(round(keep_alive_timeout * 1000)),
        str(max_requests_per_socket),
        str(log),
    ]
    with processes.running(
        "node origin",
        argv,
        log=workdir / "node.output",
        is_ready=lambda: processes.accepts(host, port),
    ):
        yield NodeOrigin(host, port, log)
