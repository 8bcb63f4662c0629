"""The gateway's request path, top-down in `Gateway.chat`.

    chat(body, tenant, bearer, endpoint)    tenant: auth.resolve_tenant's, the only decision
      entry = _open(tenant, body)           one request-log line and span, closed once
      outcome = store_io.read(cache.begin)  the library's layers and policy (cache.py), each
                                            store call within its budget, where store_guard.py
                                            says: on the loop when the store cannot make it
                                            wait (memory, SQLite), else on the store pool
      a Completion → reply: JSON, or its SSE replay; `x-infercache: exact-hit | semantic-hit`
      a Miss → coalesce(miss, ..., replica fetch)    the one miss protocol (miss_flight.py):
                                            one upstream call per key in flight, the leader's
                                            fetch through the replicas (replica_fetch.py)
          not streaming: await its answer → JSON
          streaming: wait for its first event (a refusal keeps its own HTTP status), then SSE
      entry.close(status, answer)
    embeddings(body, tenant, bearer)        per input (../embeddings/), the missing inputs
                                            fetched through the same protocol

What differs between the cached endpoints (chat, completions, Anthropic's messages, OpenAI's
responses) is an adapter (endpoints.py), looked up in the table the gateway was built with.
Replies are plain values (`JSONReply`, `StreamReply`) so the routes (routes.py) only do HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from infercache.cache import Cache
from infercache.completion import LAYER_HEADER, Completion, Layer, completion_headers, layer_headers
from infercache.embeddings.embedding_cache import EmbeddingCache
from infercache.embeddings.embedding_miss import AsyncEmbeddingFunction
from infercache.errors import InfercacheError, NotFoundError, UpstreamError
from infercache.gateway.across_replicas import AcrossReplicas
from infercache.gateway.endpoints import ENDPOINTS, CachedEndpoint, UpstreamCall
from infercache.gateway.prefix_usage import UpstreamPrefixUsage
from infercache.gateway.replica_fetch import ReplicaFetch
from infercache.gateway.replica_load import LoadPoller
from infercache.gateway.requestlog import LogEntry, RequestLog
from infercache.gateway.router import PrefixRouter, RouterConfig
from infercache.gateway.tracing import NoTracer, RequestTracer
from infercache.gateway.traffic import RequestMetrics
from infercache.gateway.upstream import EmbeddingsUpstream, Upstream
from infercache.gateway.versions import ModelVersionTracker
from infercache.hit_usage import served_hit
from infercache.http_errors import INTERNAL_ERROR
from infercache.miss import Miss
from infercache.miss_flight import MissFlight, coalesce
from infercache.request import Endpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JSONReply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]
    raw: bytes | None = None  # `body` as JSON already (a hit's stored bytes)


@dataclass(frozen=True, slots=True)
class StreamReply:
    headers: dict[str, str]
    events: AsyncIterator[bytes]


class Gateway:
    def __init__(
        self,
        cache: Cache,
        upstreams: Sequence[Upstream],
        *,
        tracker: ModelVersionTracker,
        request_log: RequestLog | None = None,
        router_config: RouterConfig | None = None,
        across: AcrossReplicas | None = None,
        embedder: EmbeddingsUpstream | None = None,
        tracer: RequestTracer | None = None,
        endpoints: Mapping[Endpoint, CachedEndpoint] = ENDPOINTS,
        prefix_usage: UpstreamPrefixUsage | None = None,
    ) -> None:
        self.cache = cache
        self.endpoints = endpoints
        self.tracer: RequestTracer = tracer or NoTracer()
        self.traffic = RequestMetrics.of(cache)  # /metrics per model and tenant (traffic.py)
        self.across = across
        self.embedder = embedder
        self.embedding_cache = EmbeddingCache.of(cache)
        self.upstreams = list(upstreams)
        self.router: PrefixRouter[Upstream] = PrefixRouter(self.upstreams, router_config)
        self.load_poller = LoadPoller(self.router, self.upstreams)  # replicas' /metrics
        self.tracker = tracker
        self.request_log = request_log
        self.flights = cache.flights
        self.store_io = cache.store_io  # where store I/O runs (store_guard.py)
        self.prefix_usage = prefix_usage or UpstreamPrefixUsage(cache.metrics)
        self.replicas = ReplicaFetch(
            self.upstreams,
            self.router,
            tracker=tracker,
            prefix_usage=self.prefix_usage,
            across=across,
            endpoints=endpoints,
        )
        self._clock = cache.clock
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the gateway serves on; background threads reach the upstreams through it."""
        self._loop = loop
        self.load_poller.start()

    def background_fetch(
        self, tenant: str, bearer: str | None, endpoint: Endpoint = Endpoint.CHAT
    ) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A blocking upstream call of `endpoint`'s API for background threads (live
        verification of semantic hits, the LLM judge): it runs on the gateway's loop and never
        on a request's path."""
        adapter, who = self.endpoints[endpoint], UpstreamCall(tenant, bearer)

        async def call(body: dict[str, Any]) -> dict[str, Any]:
            with self.router.lease(tenant, body) as replica:
                return await adapter.complete(self.upstreams[replica], body, who)

        def fetch(body: dict[str, Any]) -> dict[str, Any]:
            if self._loop is None:
                raise RuntimeError("the gateway is not serving yet")
            return asyncio.run_coroutine_threadsafe(call(body), self._loop).result(600)

        return fetch

    # -- the request path --

    async def chat(
        self,
        body: dict[str, Any],
        *,
        tenant: str,
        bearer: str | None,
        endpoint: Endpoint = Endpoint.CHAT,
        beta: str | None = None,
    ) -> JSONReply | StreamReply:
        adapter = self.endpoints[endpoint]
        entry = self._open(tenant, body, adapter.operation)
        try:
            outcome = await self._begin(body, tenant, bearer, endpoint, beta)
            entry.layer = LAYER_HEADER[outcome.layer]
            if isinstance(outcome, Completion):
                reply = self._replay(outcome, body, adapter)
                entry.close(status=200, response=outcome.response)
                return reply
            source = self.replicas.source(bearer)
            flight = coalesce(outcome, self.flights, source, self.store_io, self._clock)
            if outcome.request.stream:
                return await self._stream(outcome, flight, entry, adapter)
            done: Completion = await flight.answer()
            entry.close(status=200, response=done.response, upstream_s=done.upstream_s)
            return self._replay(done, body, adapter)
        except BaseException as exc:
            entry.close(status=_status_of(exc))
            raise

    def _open(self, tenant: str, body: dict[str, Any], operation: str) -> LogEntry:
        """The request's record: its log line and its tracing span, closed once together."""
        span = self.tracer.start(operation, body.get("model"))
        return LogEntry(
            self.request_log,
            self.traffic,
            span,
            self._clock,
            operation=operation,
            tenant=tenant,
            body=body,
        )

    def _begin(
        self,
        body: dict[str, Any],
        tenant: str,
        bearer: str | None,
        endpoint: Endpoint,
        beta: str | None,
    ) -> Coroutine[Any, Any, Completion | Miss]:
        """The lookup, where StoreIO says (a coroutine: one frame less on every request)."""
        # Live verification needs a way upstream only when the semantic layer is on.
        verify = self.background_fetch(tenant, bearer, endpoint) if self.cache.semantic else None
        return self.store_io.read(
            self.cache.begin, body, tenant=tenant, verify=verify, endpoint=endpoint, beta=beta
        )

    def _replay(
        self, done: Completion, body: dict[str, Any], adapter: CachedEndpoint
    ) -> JSONReply | StreamReply:
        """An answer as a reply: JSON, or a hit's replay as the endpoint's stream; a hit
        (coalesced answers too) reports the usage the `hit_usage` setting says (hit_usage.py)."""
        headers = completion_headers(done)
        response, raw = done.response, done.raw
        if done.layer in (Layer.EXACT, Layer.SEMANTIC):
            response, saved, raw = served_hit(response, self.cache.settings.hit_usage, raw)
            headers.update(saved)
        if body.get("stream") is not True:
            return JSONReply(200, response, headers, raw)
        writer = adapter.writer(body)

        async def replay() -> AsyncIterator[bytes]:
            for event in writer.replay(response):
                yield event
            yield writer.end

        return StreamReply(headers, replay())

    async def _stream(
        self, miss: Miss, flight: MissFlight[Completion], entry: LogEntry, adapter: CachedEndpoint
    ) -> StreamReply:
        coalesced = await flight.start_stream()  # raises an upstream refusal
        if coalesced:
            headers = layer_headers(Layer.EXACT, age_s=0.0, coalesced=True)
        else:
            headers = layer_headers(miss.layer)
        events = self._events(miss, flight, entry, adapter, coalesced)
        return StreamReply(headers, events)

    async def _events(
        self,
        miss: Miss,
        flight: MissFlight[Completion],
        entry: LogEntry,
        adapter: CachedEndpoint,
        coalesced: bool,
    ) -> AsyncIterator[bytes]:
        """The flight's chunks as this client asked for them (the endpoint's writer), then the
        end; an error event when the answer fails. A coalesced reader's usage is a hit's."""
        writer = adapter.writer(miss.request.body)
        hit_usage = self.cache.settings.hit_usage
        done: Completion | None = None
        try:
            async with aclosing(flight.chunks(adapter.chunks)) as chunks:
                async for chunk in chunks:
                    if coalesced:  # a hit: its usage as the hit_usage setting says
                        chunk = adapter.hit_chunk(chunk, hit_usage)
                    event = writer.event(chunk)
                    if event is not None:
                        yield event
            done = flight.flight.outcome()
            yield writer.end
        except UpstreamError as exc:  # cut off upstream, or every other reader left
            yield writer.error(exc)
        except Exception:  # logged; the client gets an error event
            log.exception("the answer for %s failed mid-stream", miss.flight_key)
            yield writer.error(InfercacheError(INTERNAL_ERROR))
        finally:
            entry.close(
                status=200 if done is not None else 499,
                response=done.response if done is not None else None,
                upstream_s=done.upstream_s if done is not None else None,
            )

    # -- embeddings --

    async def embeddings(
        self, body: dict[str, Any], *, tenant: str, bearer: str | None
    ) -> JSONReply:
        """`/v1/embeddings`, cached per input: only the inputs not cached go upstream, in one
        call shared by identical batches in flight, and the answer is assembled in request
        order (embeddings/embedding_cache.py)."""
        entry = self._open(tenant, body, "embeddings")

        async def embed(sent: dict[str, Any]) -> dict[str, Any]:
            if self.embedder is None:
                raise NotFoundError("no upstream serves /v1/embeddings")
            return await self.embedder.embeddings(sent, tenant=tenant, api_key=bearer)

        try:
            cache = self.embedding_cache
            lookup = await self.store_io.read(cache.begin, body, tenant=tenant)
            result = await cache.afetch_missing(lookup, AsyncEmbeddingFunction(embed))
        except BaseException as exc:
            entry.close(status=_status_of(exc))
            raise
        inputs = len(lookup.request.keys)
        layer = "exact-hit" if result.hits == inputs else "miss"
        entry.layer = layer
        entry.close(status=200, response=result.response)
        headers = {"x-infercache": layer, "x-infercache-cached-inputs": str(result.hits)}
        return JSONReply(200, result.response, headers)

    async def aclose(self) -> None:
        """Shut down after the server drained: the upstreams, the log, the replica flights,
        then the cache, so what its store holds in memory (SQLite's batched recency of hits)
        is written and the semantic layer's sync thread ends."""
        await self.load_poller.aclose()
        for upstream in self.upstreams:
            await upstream.aclose()
        if self.request_log is not None:
            self.request_log.close()
        if self.across is not None:
            await self.across.aclose()
        try:
            await self.store_io.off_loop(self.cache.close)  # its store pool last
        except InfercacheError as exc:
            log.warning("the cache did not close cleanly: %s", exc)


def _status_of(exc: BaseException) -> int:
    """The HTTP status a failed request is logged with (499: the client went away)."""
    if isinstance(exc, InfercacheError):
        return exc.status_code
    return 499 if isinstance(exc, asyncio.CancelledError) else 500
