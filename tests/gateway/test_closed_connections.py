"""An upstream that closes a connection without answering (what a server's closing of an idle
kept-alive connection looks like to the request that picked it from the pool at that moment):
the gateway asks once more on a new connection instead of failing the request, and asks only
once (a server that drops every request is unreachable: 502, ejected).

The upstream is a plain HTTP/1.1 server on a real socket (asyncio streams in a thread): an ASGI
server cannot drop a request unanswered, which is the point here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson

from infercache.gateway.build import build
from infercache.gateway.config import GatewayConfig
from infercache.settings import Settings
from tests.harness.servers import serve
from tests.harness.vocabulary import chat


class DroppingUpstream:
    """Answers chat completions, dropping (closing unanswered) the first `drop` requests."""

    def __init__(self, drop: int) -> None:
        self.drop = drop
        self.requests = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        for writer in self._writers:
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            await self._answer(reader, writer)
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed its kept-alive connection
                return
            lines = head.decode("latin-1").split("\r\n")
            length = next(
                int(line.split(":", 1)[1])
                for line in lines
                if line.lower().startswith("content-length")
            )
            request = orjson.loads(await reader.readexactly(length))
            self.requests += 1
            if self.requests <= self.drop:
                return  # closed unanswered: the client sees the server disconnect
            answer = orjson.dumps(
                {
                    "id": f"chatcmpl-{self.requests}",
                    "object": "chat.completion",
                    "created": 1,
                    "model": request["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "four"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
            )
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(answer)}\r\n\r\n".encode()
                + answer
            )
            await writer.drain()

    @contextmanager
    def running(self) -> Iterator[str]:
        self._thread.start()
        self._ready.wait(timeout=10)
        try:
            yield f"http://127.0.0.1:{self.port}/v1"
        finally:
            assert self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=10)
            self._loop.close()


@contextmanager
def gateway(tmp_path: Path, upstream_url: str) -> Iterator[httpx.Client]:
    settings = Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path / 'g.db'}")
    config = GatewayConfig(upstreams=(upstream_url,), store_budget_s=0.5, version_poll_s=None)
    built = build(settings, config)
    with serve(built.app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_a_request_the_upstream_dropped_unanswered_is_asked_again(tmp_path: Path) -> None:
    upstream = DroppingUpstream(drop=1)
    with upstream.running() as url, gateway(tmp_path, url) as client:
        reply = client.post("/v1/chat/completions", json=chat("What is 2+2?", model="m"))
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "four"
        assert upstream.requests == 2  # the dropped one and the one asked again
        again = client.post("/v1/chat/completions", json=chat("What is 2+2?", model="m"))
        assert again.headers["x-infercache"] == "exact-hit"  # and it was cached as usual


def test_an_upstream_that_drops_every_request_is_asked_only_twice(tmp_path: Path) -> None:
    upstream = DroppingUpstream(drop=10)
    with upstream.running() as url, gateway(tmp_path, url) as client:
        reply = client.post("/v1/chat/completions", json=chat("What is 2+2?", model="m"))
        assert reply.status_code == 502
        assert reply.json()["error"]["type"] == "upstream_unavailable"
        assert upstream.requests == 2
