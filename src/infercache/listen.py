"""The listening socket of a server, bound before anything slow loads.

`serve` and `engine serve` load a model first and only then started listening, so a port
already in use was reported after the model had loaded (seconds to minutes). They bind first
(`bind_listener`), then load, then hand the bound socket to uvicorn:
`BoundServer(config).run(sockets=[sock])`, which still logs "Uvicorn running on ..." as
uvicorn does for a socket it binds itself (scripts and tests wait on that line). A port that
cannot be bound is a `ConfigError` naming the address and what to change; the socket is bound
as uvicorn binds its own (SO_REUSEADDR, IPv6 for an address with a colon).
"""

from __future__ import annotations

import errno
import logging
import socket

from infercache.errors import ConfigError
from infercache.server_exit import DrainingServer


def bind_listener(host: str, port: int, *, flag: str = "--port") -> socket.socket:
    """A socket bound to (host, port), ready for uvicorn; `ConfigError` if it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on connections whose socket
    # says TCP (base_events._set_nodelay); with proto 0 every answer after a connection's
    # first waited ~40 ms for the client's delayed ACK (Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"cannot listen on {shown}: the port is already in use (another server on "
                f"it?); choose another with {flag}"
            ) from exc
        raise ConfigError(f"cannot listen on {shown}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


class BoundServer(DrainingServer):
    """uvicorn's server on sockets bound beforehand, logging where it listens as uvicorn does
    for a socket it binds itself (it logs nothing when handed sockets)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and sockets:
            port = sockets[0].getsockname()[1]
            host = self.config.host
            shown = f"[{host}]" if ":" in host else host
            scheme = "https" if self.config.ssl else "http"
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on %s://%s:%d (Press CTRL+C to quit)", scheme, shown, port
            )
