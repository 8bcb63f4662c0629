"""The gateway's request path, top-down in `Gateway.chat`.

    chat(body, tenant, bearer, endpoint)    tenant: auth.resolve_tenant's, the only decision
      entry = _open(tenant, body)           one request-log line and span, closed once
      placement = versions.place            route first: the version of the replica it would
                                            be sent to, its rollout arm (version_steps.py);
                                            placed again once if that version was retired
      outcome = store_io.read(cache.begin)  the library's layers and policy (cache.py), under
                                            that version; each
                                            store call within its budget, where store_guard.py
                                            says: on the loop when the store cannot make it
                                            wait (memory, SQLite), else on the store pool
      a Completion → reply: JSON, or its SSE replay; `x-infercache: exact-hit | semantic-hit`
      a Miss → coalesce(miss, ..., replica fetch)    the one miss protocol (miss_flight.py):
                                            one upstream call per key in flight, the leader's
                                            fetch through the replicas (replica_fetch.py)
          not streaming: await its answer → JSON
          streaming: wait for its first event (a refusal keeps its own HTTP status), then SSE
      entry.close(status, answer)           and the answer mirrored, for shadow traffic
    embeddings(body, tenant, bearer)        per input (../embeddings/), the missing inputs
                                            fetched through the same protocol

What differs between the cached endpoints (chat, completions, Anthropic's messages, OpenAI's
responses) is an adapter (endpoints.py), looked up in the table the gateway was built with.
Replies are plain values (`JSONReply`, `StreamReply`, made in replies.py) so the routes
(routes.py) only do HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from infercache.cache import Cache
from infercache.completion import LAYER_HEADER, Completion
from infercache.embeddings.embedding_cache import EmbeddingCache
from infercache.embeddings.embedding_miss import AsyncEmbeddingFunction
from infercache.errors import InfercacheError, NotFoundError
from infercache.gateway.across_replicas import AcrossReplicas
from infercache.gateway.endpoints import ENDPOINTS, CachedEndpoint
from infercache.gateway.placement import Placement
from infercache.gateway.prefix_usage import UpstreamPrefixUsage
from infercache.gateway.replica_fetch import ReplicaFetch
from infercache.gateway.replica_load import LoadPoller
from infercache.gateway.replies import JSONReply, StreamReply, replay, stream
from infercache.gateway.requestlog import LogEntry, RequestLog
from infercache.gateway.router import PrefixRouter, RouterConfig
from infercache.gateway.tracing import NoTracer, RequestTracer
from infercache.gateway.traffic import RequestMetrics
from infercache.gateway.upstream_protocols import EmbeddingsUpstream, Upstream, UpstreamCall
from infercache.gateway.version_probe import VersionProber
from infercache.gateway.version_steps import VersionSteps
from infercache.gateway.versions import ModelVersionTracker
from infercache.miss import Miss
from infercache.miss_flight import coalesce
from infercache.request import Endpoint

log = logging.getLogger(__name__)


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
        self.versions = VersionSteps(cache, tracker, self.router, self.upstreams, request_log)
        self.rollout = self.versions.rollout
        self.prober: VersionProber | None = None  # the app's lifespan starts it
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
        self.versions.shadow.start()

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
            placement = self.versions.place(tenant, body)
            outcome = await self._begin(body, tenant, bearer, endpoint, beta, placement)
            if self.versions.replan(outcome, placement):  # its version was retired elsewhere
                placement = self.versions.place(tenant, body)
                outcome = await self._begin(body, tenant, bearer, endpoint, beta, placement)
            entry.layer, entry.version = LAYER_HEADER[outcome.layer], placement.version
            self.versions.count(body, placement, entry.layer)
            mirror = self.versions.mirror(tenant, body, placement)
            if isinstance(outcome, Completion):
                reply = replay(outcome, body, adapter, self.cache.settings.hit_usage)
                entry.close(status=200, response=outcome.response)
                if mirror is not None:
                    mirror(outcome.response)
                return reply
            source = entry.answered_by = self.replicas.source(bearer, placement)
            flight = coalesce(outcome, self.flights, source, self.store_io, self._clock)
            if outcome.request.stream:
                hit_usage = self.cache.settings.hit_usage
                return await stream(outcome, flight, entry, adapter, mirror, hit_usage)
            done: Completion = await flight.answer()
            entry.close(status=200, response=done.response, upstream_s=done.upstream_s)
            if mirror is not None:
                mirror(done.response)
            return replay(done, body, adapter, self.cache.settings.hit_usage)
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
        placement: Placement,
    ) -> Coroutine[Any, Any, Completion | Miss]:
        """The lookup under the placement's version, where StoreIO says (a coroutine: one
        frame less on every request)."""
        # Live verification needs a way upstream only when the semantic layer is on.
        verify = self.background_fetch(tenant, bearer, endpoint) if self.cache.semantic else None
        return self.store_io.read(
            self.cache.begin,
            body,
            tenant=tenant,
            verify=verify,
            endpoint=endpoint,
            beta=beta,
            version=placement.version,
            cached=placement.cached,
            follow_label=placement.version is None,
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
        await self.versions.shadow.aclose()
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
