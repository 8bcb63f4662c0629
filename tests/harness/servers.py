"""Real HTTP servers on loopback, the one way every test starts one: `serve(app)` runs any ASGI
app (a gateway, the engine's server, a stand-in upstream) under uvicorn in a thread on a port
bound before it starts, and yields its base URL once the app's lifespan has run. `free_port()`
for a process that binds its own port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    """A uvicorn server that says when its start-up (the app's lifespan included) is done."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


@contextlib.contextmanager
def serve(app: Any, **config: Any) -> Iterator[str]:
    """Run `app` on a loopback port in a thread; yield its base URL once it has started: the
    app's lifespan has run and the server accepts connections. No polling, no sleeping."""
    # Created as TCP (IPPROTO_TCP) so asyncio sets TCP_NODELAY on its connections: with proto 0
    # it does not, and each request after the first on a connection waits ~40 ms (Nagle
    # against the client's delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(app, **{"log_level": "warning", "lifespan": "on", **config}))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        if not server.ready.wait(60) or not server.started:
            raise RuntimeError("the test server did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def free_port() -> int:
    """A loopback port free now (for a process that binds it itself)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
