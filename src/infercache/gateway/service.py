"""The gateway's request path, top-down in `Gateway.chat`; its miss path in `_fetch`.

    chat(body, tenant, bearer)              tenant: auth.resolve_tenant's, the only decision
      entry = log.open(tenant, body)        one request-log line, closed once (requestlog.py)
      outcome = cache.begin(body, tenant)   the library's layers and policy (cache.py), each
                                            store call within its budget (store_guard.py): on
                                            the loop when the store's reads cannot wait
                                            (memory, SQLite; else retried), on the store pool
                                            otherwise (Redis, or an embedding to compute)
      a Completion → reply: JSON, or its SSE replay; `x-infercache: exact-hit | semantic-hit`
      a Miss → flights.lead_or_join(key)    one upstream call per key in flight (flight.py)
        leader: start _fetch(miss, flight) as a task, which owns the leader's Miss:
                  router.lease → a replica, counted in flight while the call runs (router.py)
                  the upstream call, streamed or not; every chunk published to the flight;
                  a replica that fails before any chunk is ejected, and the call is tried
                  once more on another
                  flight.settle(completion): every reader has its answer now
                  on the store pool: tracker.observe_response (swap detection), then
                  miss.close(response): counted, stored if allowed
                  prefix usage (prefix_usage.py)
                  finally: miss.close(None) and flight.settle(error), no-ops once done
        leader and waiters alike then read the flight:
          not streaming: await flight.result() → JSON
          streaming: wait for its first event (a refusal keeps its own HTTP status), then SSE
        a waiter owns its own Miss: miss.close_shared(the leader's completion | None)
      entry.close(status, answer)

The fetch runs as its own task so the leader's client hanging up does not cut the answer the
waiters are reading; when every reader has left, the flight cancels it and nothing is stored.
Replies are plain values (`JSONReply`, `StreamReply`) so app.py only does HTTP.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from infercache.cache import Cache, Completion, Layer, Miss
from infercache.chat import SSE_DONE, CompletionAssembler, chunks_from_completion, sse_event
from infercache.embedding_cache import EmbeddingCache
from infercache.errors import (
    InfercacheError,
    NotFoundError,
    StoreError,
    StoreWouldBlockError,
    UpstreamAbortedError,
    UpstreamError,
    UpstreamUnavailableError,
)
from infercache.flight import Flight
from infercache.gateway.across_replicas import AcrossReplicas
from infercache.gateway.prefix_usage import UpstreamPrefixUsage
from infercache.gateway.replica_load import LoadPoller
from infercache.gateway.requestlog import LogEntry, RequestLog
from infercache.gateway.router import PrefixRouter, RouterConfig
from infercache.gateway.tracing import NoTracer, RequestTracer
from infercache.gateway.traffic import RequestMetrics
from infercache.gateway.upstream import EmbeddingsUpstream, TextCompletions, Upstream
from infercache.gateway.versions import ModelVersionTracker
from infercache.hit_usage import served_hit
from infercache.http_errors import internal_error_body
from infercache.request import Endpoint
from infercache.store_guard import inline_reads, inline_writes
from infercache.stores.replica_flight import FlightLease, SharedAnswer

log = logging.getLogger(__name__)

T = TypeVar("T")

LAYER_HEADER = {
    Layer.EXACT: "exact-hit",
    Layer.SEMANTIC: "semantic-hit",
    Layer.MISS: "miss",
    Layer.BYPASS: "bypass",
    Layer.UNCACHEABLE: "uncacheable",
}


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


def _reply_headers(done: Completion) -> dict[str, str]:
    headers = {"x-infercache": LAYER_HEADER[done.layer]}
    if done.layer in (Layer.EXACT, Layer.SEMANTIC):
        headers["age"] = str(int(done.age_s or 0))
    if done.coalesced:
        headers["x-infercache-coalesced"] = "true"
    if done.similarity is not None:
        headers["x-infercache-similarity"] = f"{done.similarity:.4f}"
    return headers


def _for_client(chunk: dict[str, Any], include_usage: bool) -> dict[str, Any] | None:
    """The chunk as this client asked for it: usage only with `stream_options.include_usage`."""
    if include_usage or chunk.get("usage") is None:
        return chunk
    if not chunk.get("choices"):
        return None
    return {k: v for k, v in chunk.items() if k != "usage"}


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
    ) -> None:
        self.cache = cache
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
        self._clock = cache.clock
        self._prefix_usage = UpstreamPrefixUsage(
            cache.metrics.strategy("prefix"), cache.metrics.prices
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        # Store I/O (lookups, stores, version writes) never runs on the event loop. As many
        # workers as cores: more only add GIL hand-offs (measured: 2 workers served ~20% more
        # hits/s than 8 on 2 cores); a stalled store holds each for at most its budget.
        self._store_pool = ThreadPoolExecutor(
            min(8, os.cpu_count() or 2), thread_name_prefix="infercache-lookup"
        )
        # Lookups on a store whose reads never wait run on the loop itself (see _begin).
        self._inline_reads = inline_reads(cache.backend)
        self.lookups_retried_off_loop = 0
        # A miss's writes likewise, when the store can take its write lock at once (see _store).
        self._inline_writes = inline_writes(cache.backend)
        self.stores_retried_off_loop = 0

    async def offload(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn` (which touches the store) on the store pool, off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._store_pool, functools.partial(fn, *args, **kwargs))

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the gateway serves on; background threads reach the upstreams through it."""
        self._loop = loop
        self.load_poller.start()

    def background_fetch(
        self, tenant: str, bearer: str | None
    ) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A blocking upstream call for background threads (live verification of semantic
        hits, the LLM judge): it runs on the gateway's loop and never on a request's path."""

        async def call(body: dict[str, Any]) -> dict[str, Any]:
            with self.router.lease(tenant, body) as replica:
                return await self.upstreams[replica].complete(body, tenant=tenant, api_key=bearer)

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
    ) -> JSONReply | StreamReply:
        entry = self._open(tenant, body, "chat" if endpoint is Endpoint.CHAT else "completions")
        try:
            outcome = await self._begin(body, tenant, bearer, endpoint)
            if isinstance(outcome, Completion):
                entry.layer = LAYER_HEADER[outcome.layer]
                reply = self._replay(outcome, body)
                entry.close(status=200, response=outcome.response)
                return reply
            miss = outcome
            entry.layer = LAYER_HEADER[miss.layer]
            flight, leader = self.flights.lead_or_join(miss.flight_key)
            fetch: asyncio.Task[None] | None = None
            if leader:
                # The task starts before any reader below can wait and leave (call_soon
                # order), so an idle cancel always reaches a running `_fetch`.
                fetch = asyncio.ensure_future(self._fetch(miss, flight, bearer))
                flight.cancel_when_idle(fetch)
            if miss.request.stream:
                return await self._stream(miss, flight, fetch, entry)
            done = await self._answer(miss, flight, fetch)
            entry.close(status=200, response=done.response, upstream_s=done.upstream_s)
            return self._replay(done, body)
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

    async def _begin(
        self, body: dict[str, Any], tenant: str, bearer: str | None, endpoint: Endpoint
    ) -> Completion | Miss:
        if self._inline_reads is not None and self.cache.semantic is None:
            # The lookup reads a store that cannot make it wait (memory, SQLite): on the loop,
            # sparing the thread hop. Anything that would wait is retried on the pool.
            try:
                with self._inline_reads():
                    return self.cache.begin(body, tenant=tenant, endpoint=endpoint)
            except StoreWouldBlockError:
                self.lookups_retried_off_loop += 1
        verify = self.background_fetch(tenant, bearer) if self.cache.semantic else None
        return await self.offload(
            self.cache.begin, body, tenant=tenant, verify=verify, endpoint=endpoint
        )

    def _replay(self, done: Completion, body: dict[str, Any]) -> JSONReply | StreamReply:
        """An answer as a reply: JSON, or a hit's SSE replay; a hit (coalesced answers too)
        reports the usage the `hit_usage` setting says (hit_usage.py)."""
        headers = _reply_headers(done)
        response, raw = done.response, done.raw
        if done.layer in (Layer.EXACT, Layer.SEMANTIC):
            response, saved, raw = served_hit(response, self.cache.settings.hit_usage, raw)
            headers.update(saved)
        if body.get("stream") is not True:
            return JSONReply(200, response, headers, raw)
        include_usage = _include_usage(body)

        async def replay() -> AsyncIterator[bytes]:
            for chunk in chunks_from_completion(response, include_usage=include_usage):
                yield sse_event(chunk)
            yield SSE_DONE

        return StreamReply(headers, replay())

    async def _answer(
        self, miss: Miss, flight: Flight[Completion], fetch: asyncio.Task[None] | None
    ) -> Completion:
        """The flight's answer, not streamed. The leader's Miss is closed by its fetch, which
        the leader waits for (its store is within the store budget), so the leader's client
        finds the answer stored when it asks again; waiters never wait for the store."""
        if fetch is not None:
            done = await flight.result()
            await _finished(fetch)
            return done
        try:
            return _first_close(miss.close_shared(await flight.result()))
        finally:
            miss.close_shared(None)  # no-op unless the flight failed or we were cancelled

    async def _stream(
        self,
        miss: Miss,
        flight: Flight[Completion],
        fetch: asyncio.Task[None] | None,
        entry: LogEntry,
    ) -> StreamReply:
        leader = fetch is not None
        # Wait for the first event, so an upstream refusal still gets its own HTTP status.
        await flight.first_event()
        refusal = flight.error_before_chunks
        if refusal is not None:
            if not leader:
                miss.close_shared(None)
            raise refusal
        settled = flight.result_now()
        coalesced = not leader or (settled is not None and settled.coalesced)
        headers = {"x-infercache": LAYER_HEADER[Layer.EXACT if coalesced else miss.layer]}
        if coalesced:
            headers.update({"age": "0", "x-infercache-coalesced": "true"})
        include_usage = _include_usage(miss.request.body)

        async def events() -> AsyncIterator[bytes]:
            done: Completion | None = None
            try:
                async for chunk in flight.chunks():
                    out = _for_client(chunk, include_usage)
                    if coalesced and out is not None and out.get("usage") is not None:
                        out = served_hit(out, self.cache.settings.hit_usage).response
                    if out is not None:
                        yield sse_event(out)
                done = flight.outcome()
                if fetch is not None:
                    await _finished(fetch)  # stored before [DONE], as for JSON replies
                yield SSE_DONE
            except UpstreamError as exc:  # cut off upstream, or every other reader left
                yield sse_event(exc.to_openai())
            except Exception:  # logged; the client gets an error event
                log.exception("the answer for %s failed mid-stream", miss.flight_key)
                yield sse_event(internal_error_body())
            finally:
                if not leader:
                    miss.close_shared(done)
                entry.close(
                    status=200 if done is not None else 499,
                    response=done.response if done is not None else None,
                    upstream_s=done.upstream_s if done is not None else None,
                )

        return StreamReply(headers, events())

    # -- embeddings --

    async def embeddings(
        self, body: dict[str, Any], *, tenant: str, bearer: str | None
    ) -> JSONReply:
        """`/v1/embeddings`, cached per input: only the inputs not cached go upstream, in one
        call, and the answer is assembled in request order (embedding_cache.py)."""
        entry = self._open(tenant, body, "embeddings")
        try:
            cache = self.embedding_cache
            lookup = await self.offload(cache.begin, body, tenant=tenant)
            sent = lookup.upstream_body
            if sent is None:
                result = await self.offload(cache.finish, lookup, None, upstream_s=0.0)
            else:
                if self.embedder is None:
                    raise NotFoundError("no upstream serves /v1/embeddings")
                started = self._clock.monotonic_s()
                answer = await self.embedder.embeddings(sent, tenant=tenant, api_key=bearer)
                upstream_s = self._clock.monotonic_s() - started
                result = await self.offload(cache.finish, lookup, answer, upstream_s=upstream_s)
        except BaseException as exc:
            entry.close(status=_status_of(exc))
            raise
        inputs = len(lookup.request.keys)
        layer = "exact-hit" if result.hits == inputs else "miss"
        entry.layer = layer
        entry.close(status=200, response=result.response)
        headers = {"x-infercache": layer, "x-infercache-cached-inputs": str(result.hits)}
        return JSONReply(200, result.response, headers)

    # -- the miss path --

    async def _fetch(self, miss: Miss, flight: Flight[Completion], bearer: str | None) -> None:
        """Fetch the leader's Miss upstream, publish every chunk, close the Miss, settle the
        flight: the one function that owns the leader's lease, closed exactly once."""
        done: Completion | None = None
        error: BaseException | None = None
        lease: FlightLease | None = None
        try:
            started = self._clock.monotonic_s()
            across = await self.across.join(miss) if self.across is not None else None
            if isinstance(across, SharedAnswer):  # another gateway replica fetched it
                done = self._answered_elsewhere(miss, flight, across)
                flight.settle(done, None)
                return
            lease = across
            upstream, response = await self._call_replicas(miss, flight, bearer)
            upstream_s = self._clock.monotonic_s() - started
            done = miss.answer(response, upstream_s)
            flight.settle(done, None)  # every reader has its answer; storing can take its time
            if lease is not None:
                await AcrossReplicas.publish(lease, response)
            if not upstream.records_prefix_metrics:
                self._prefix_usage.count(response)
            await self._store(miss, response, upstream_s)
        except asyncio.CancelledError:
            error = UpstreamAbortedError("every client left before the answer completed")
            raise
        except Exception as exc:  # noqa: BLE001 - handed to every reader through the flight
            error = exc
            log.info("upstream call for %s ended without an answer: %r", miss.flight_key, exc)
        finally:
            if lease is not None and not lease.closed:
                await AcrossReplicas.fail(lease, error or UpstreamAbortedError("no answer"))
            miss.close(None)  # no-op unless the call or the close failed
            flight.settle(done, error)

    def _answered_elsewhere(
        self, miss: Miss, flight: Flight[Completion], shared: SharedAnswer
    ) -> Completion:
        """Another gateway replica's answer to this Miss: a coalesced hit (or its error)."""
        body = shared.completion()
        if not shared.ok:
            error = body.get("error")
            message = str(error.get("message")) if isinstance(error, dict) else "upstream error"
            raise UpstreamError(message, status_code=shared.status, body=body)
        flight.publish(*chunks_from_completion(body, include_usage=True))
        return _first_close(miss.close_shared(miss.answer(body, upstream_s=0.0)))

    async def _call_replicas(
        self, miss: Miss, flight: Flight[Completion], bearer: str | None
    ) -> tuple[Upstream, dict[str, Any]]:
        """The upstream call on the replica the router picks; when that replica fails before
        any chunk came back (unreachable, timed out, a 5xx), it is ejected and the call goes
        once to another replica."""
        tried: list[int] = []
        while True:
            with self.router.lease(miss.request.directives.tenant, miss.request.body, tried) as i:
                upstream = self.upstreams[i]
                try:
                    response = await self._call(upstream, miss, flight, bearer)
                except UpstreamError as exc:
                    if not _replica_fault(exc):
                        raise
                    self.router.failed(i)
                    tried.append(i)
                    if flight.published or len(tried) > 1 or len(self.upstreams) == 1:
                        raise
                    log.warning("retrying on another replica after: %s", exc.message)
                    continue
            self.router.succeeded(i)
            return upstream, response

    async def _store(self, miss: Miss, response: dict[str, Any], upstream_s: float) -> None:
        """`_record` on the loop when the store's writes cannot make it wait (memory; SQLite
        when its write lock is free at once: one transaction of ~0.1 ms), else on the pool.
        A thread hop here cost a miss ~0.5 ms of CPU, more than the write itself
        (bench/README.md, "Gateway")."""
        if self._inline_writes is not None and self.cache.semantic is None:
            try:
                with self._inline_writes():
                    self._record(miss, response, upstream_s)
                return
            except StoreWouldBlockError:  # raised on entry: nothing was written yet
                self.stores_retried_off_loop += 1
            except StoreError as exc:  # the commit failed: the entry is lost, the answer is not
                self.cache.exact.store_failed("store", exc)
                return
        await self.offload(self._record, miss, response, upstream_s)

    def _record(self, miss: Miss, response: dict[str, Any], upstream_s: float) -> None:
        """Store I/O after an answer: swap detection, then the Miss closed (stored if allowed)."""
        seen = miss.lookup.view if miss.lookup is not None else None
        self.tracker.observe_response(miss.request.model, response, seen)
        miss.close(response, upstream_s=upstream_s)

    async def _call(
        self, upstream: Upstream, miss: Miss, flight: Flight[Completion], bearer: str | None
    ) -> dict[str, Any]:
        """One upstream call, its chunks published as they come; the complete answer."""
        tenant = miss.request.directives.tenant
        body = dict(miss.request.body)
        text = miss.request.endpoint is Endpoint.COMPLETIONS
        if text and not isinstance(upstream, TextCompletions):
            raise NotFoundError(f"{upstream.name} does not serve /v1/completions")
        if not miss.request.stream:
            body.pop("stream", None)
            body.pop("stream_options", None)
            if text and isinstance(upstream, TextCompletions):
                response = await upstream.complete_text(body, tenant=tenant, api_key=bearer)
            else:
                response = await upstream.complete(body, tenant=tenant, api_key=bearer)
            flight.publish(*chunks_from_completion(response, include_usage=True))
            return response
        body["stream_options"] = {"include_usage": True}
        assembler = CompletionAssembler()
        chunks = (
            upstream.stream_text(body, tenant=tenant, api_key=bearer)
            if text and isinstance(upstream, TextCompletions)
            else upstream.stream(body, tenant=tenant, api_key=bearer)
        )
        async for chunk in chunks:
            assembler.add(chunk)
            flight.publish(chunk)
        if not assembler.complete:
            raise UpstreamAbortedError("the upstream stream ended without a finish_reason")
        return assembler.result()

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
            await self.offload(self.cache.close)
        except InfercacheError as exc:
            log.warning("the cache did not close cleanly: %s", exc)
        self._store_pool.shutdown(wait=False, cancel_futures=True)


async def _finished(task: asyncio.Task[None]) -> None:
    """Wait for `task` to end, without cancelling it if this waiter is cancelled. A task that
    has ended (a store on the loop ends with its fetch) costs no turn of the event loop:
    `asyncio.wait` would take one even then."""
    if not task.done():
        await asyncio.wait({task})


def _include_usage(body: Any) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _replica_fault(exc: UpstreamError) -> bool:
    """The replica itself failed (not the request): unreachable, timed out, or a 5xx."""
    return isinstance(exc, UpstreamUnavailableError) or exc.status_code >= 500


def _status_of(exc: BaseException) -> int:
    """The HTTP status a failed request is logged with (499: the client went away)."""
    if isinstance(exc, InfercacheError):
        return exc.status_code
    return 499 if isinstance(exc, asyncio.CancelledError) else 500


def _first_close(done: Completion | None) -> Completion:
    if done is None:
        raise RuntimeError("a waiter's Miss was closed twice")
    return done
