"""The gateway's request path: the cache's layers, then a shared upstream call, then the reply.

    chat(body, tenant):
      Cache.begin(body, tenant)            the same layers and policy as the library (cache.py)
        answered → replay it: JSON, or SSE chunks in the OpenAI schema; `x-infercache: *-hit`
        Miss     → route to a replica (router.py) and join the Flight for this key, or start one
                   (flight.py): one upstream call for every identical request in flight,
                   streaming or not. The leader's Miss is `finish`ed (counted, stored if
                   complete) when the flight completes, `abandon`ed if it fails or every client
                   leaves; each waiter counts as a coalesced hit, or abandons its own Miss.
    Every answer from upstream feeds the model-version tracker (system_fingerprint) and, unless
    the upstream records it itself, the `prefix` strategy from `usage.cached_tokens`.

Replies are plain values (`JSONReply`, `StreamReply`) so app.py only does HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from infercache.cache import Cache, Completion, Layer, Miss
from infercache.chat import SSE_DONE, chunks_from_completion, sse_event
from infercache.clock import Clock
from infercache.errors import InfercacheError, UpstreamError
from infercache.gateway.flight import Flight
from infercache.gateway.requestlog import RequestLog
from infercache.gateway.router import PrefixRouter, RouterConfig
from infercache.gateway.upstream import Upstream
from infercache.gateway.versions import ModelVersionTracker
from infercache.keys import canonical_json
from infercache.metrics import MissReason
from infercache.policy import usage_tokens

log = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class StreamReply:
    headers: dict[str, str]
    events: AsyncIterator[bytes]


@dataclass
class _Shared:
    """A flight and what its leader's Miss became."""

    flight: Flight
    replica: int
    completion: Completion | None = None
    waiters: int = 0


@dataclass
class _Trace:
    """What the request log says about one request."""

    started_s: float
    started_mono_s: float
    tenant: str
    body: dict[str, Any]
    record: dict[str, Any] = field(default_factory=dict)


def cached_tokens(response: dict[str, Any]) -> int:
    usage = response.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return value if isinstance(value, int) else 0


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
        clock: Clock,
        tracker: ModelVersionTracker,
        request_log: RequestLog | None = None,
        router_config: RouterConfig | None = None,
    ) -> None:
        self.cache = cache
        self.upstreams = list(upstreams)
        self.router: PrefixRouter[Upstream] = PrefixRouter(self.upstreams, router_config)
        self.tracker = tracker
        self._clock = clock
        self._log = request_log
        self._flights: dict[str, _Shared] = {}
        self._prefix = cache.metrics.strategy("prefix")
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the gateway serves on; background threads reach the upstreams through it."""
        self._loop = loop

    def background_fetch(
        self, tenant: str, bearer: str | None
    ) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A blocking upstream call for background threads (live verification of semantic
        hits, the LLM judge): it runs on the gateway's loop and never on a request's path."""

        def fetch(body: dict[str, Any]) -> dict[str, Any]:
            if self._loop is None:
                raise RuntimeError("the gateway is not serving yet")
            replica, _ = self.router.route(tenant, body)
            call = self.upstreams[replica].complete(body, tenant=tenant, api_key=bearer)
            return asyncio.run_coroutine_threadsafe(call, self._loop).result(600)

        return fetch

    # -- the request path --

    async def chat(
        self, body: dict[str, Any], *, tenant: str | None, bearer: str | None
    ) -> JSONReply | StreamReply:
        """`tenant`: the authenticated tenant, or None to take the one the body names."""
        if tenant is None:
            claimed = body.get("infercache")
            tenant_name = claimed.get("tenant") if isinstance(claimed, dict) else None
            shown = tenant_name if isinstance(tenant_name, str) else ""
        else:
            shown = tenant
        trace = _Trace(self._clock.now_s(), self._clock.monotonic_s(), shown, body)
        try:
            reply = await self._chat(body, tenant, bearer, trace)
        except InfercacheError as exc:
            self._write_log(trace, status=exc.status_code, layer=trace.record.get("layer"))
            raise
        if isinstance(reply, JSONReply):
            self._write_log(trace, status=reply.status, response=reply.body)
        elif not trace.record.get("log_when_stream_ends"):
            self._write_log(trace, status=200, response=trace.record.get("response"))
        return reply

    async def _chat(
        self, body: dict[str, Any], tenant: str | None, bearer: str | None, trace: _Trace
    ) -> JSONReply | StreamReply:
        stream = body.get("stream") is True
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if self.cache.semantic is None:
            outcome = self.cache.begin(body, tenant=tenant)
        else:
            # Embedding the query takes milliseconds: off the event loop, so other requests
            # (exact hits above all) are not held up behind it.
            verify = self.background_fetch(trace.tenant, bearer)
            outcome = await asyncio.to_thread(self.cache.begin, body, tenant=tenant, verify=verify)
        if isinstance(outcome, Completion):
            trace.record["layer"] = LAYER_HEADER[outcome.layer]
            trace.record["response"] = outcome.response
            return self._reply(outcome, stream, include_usage)
        miss = outcome
        trace.record["layer"] = LAYER_HEADER[miss.layer]
        shared, leader = self._join(miss, miss.request.directives.tenant, bearer, stream)
        if stream:
            trace.record["log_when_stream_ends"] = True
            return await self._stream(shared, miss, leader, include_usage, trace)
        try:
            await shared.flight.result()
        except Exception:
            if not leader:
                self.cache.abandon(miss)
            raise
        return self._reply(self._completion_of(shared, miss, leader), False, include_usage)

    def _reply(
        self, done: Completion, stream: bool, include_usage: bool
    ) -> JSONReply | StreamReply:
        headers = _reply_headers(done)
        if not stream:
            return JSONReply(200, done.response, headers)

        async def replay() -> AsyncIterator[bytes]:
            for chunk in chunks_from_completion(done.response, include_usage=include_usage):
                yield sse_event(chunk)
            yield SSE_DONE

        return StreamReply(headers, replay())

    def _completion_of(self, shared: _Shared, miss: Miss, leader: bool) -> Completion:
        assert shared.completion is not None
        return shared.completion if leader else self.cache.shared(miss, shared.completion)

    async def _stream(
        self, shared: _Shared, miss: Miss, leader: bool, include_usage: bool, trace: _Trace
    ) -> StreamReply:
        flight = shared.flight
        # Wait for the first chunk so an upstream refusal still gets its own HTTP status.
        await flight.first_chunk.wait()
        refusal = flight.error_before_chunks
        if refusal is not None:
            if not leader:
                self.cache.abandon(miss)
            raise refusal
        headers = {"x-infercache": LAYER_HEADER[miss.layer if leader else Layer.EXACT]}
        if not leader:
            headers.update({"age": "0", "x-infercache-coalesced": "true"})

        async def events() -> AsyncIterator[bytes]:
            completed = False
            try:
                async for chunk in flight.chunks():
                    out = _for_client(chunk, include_usage)
                    if out is not None:
                        yield sse_event(out)
                completed = True
                yield SSE_DONE
            except UpstreamError as exc:  # FlightAborted included: the stream was cut upstream
                yield sse_event(exc.to_openai())
            finally:
                self._stream_ended(shared, miss, leader, completed, trace)

        return StreamReply(headers, events())

    def _stream_ended(
        self, shared: _Shared, miss: Miss, leader: bool, completed: bool, trace: _Trace
    ) -> None:
        response = shared.completion.response if shared.completion is not None else None
        if not leader:
            if completed and shared.completion is not None:
                self.cache.shared(miss, shared.completion)
            else:
                self.cache.abandon(miss)
        self._write_log(trace, status=200 if completed else 499, response=response)

    # -- flights --

    def _join(
        self, miss: Miss, tenant: str, bearer: str | None, stream: bool
    ) -> tuple[_Shared, bool]:
        key = miss.flight_key
        existing = self._flights.get(key) if key is not None else None
        if existing is not None:
            existing.waiters += 1
            return existing, False
        replica, _matched = self.router.route(tenant, miss.request.body)
        upstream = self.upstreams[replica]
        body = dict(miss.request.body)
        started = self._clock.monotonic_s()

        def on_done(response: dict[str, Any]) -> None:
            self._landed(key, shared, miss, response, self._clock.monotonic_s() - started)

        def on_abort(error: BaseException | None) -> None:
            self._landed(key, shared, miss, None, 0.0)
            log.info("upstream call for %s ended without an answer: %r", key, error)

        if stream:
            body["stream_options"] = {"include_usage": True}
            flight = Flight(
                lambda: upstream.stream(body, tenant=tenant, api_key=bearer),
                on_done=on_done,
                on_abort=on_abort,
            )
        else:
            body.pop("stream", None)
            body.pop("stream_options", None)
            flight = Flight(
                call=lambda: upstream.complete(body, tenant=tenant, api_key=bearer),
                on_done=on_done,
                on_abort=on_abort,
            )
        shared = _Shared(flight, replica)
        if key is not None:
            self._flights[key] = shared
        self.router.started(replica)
        flight.start()
        return shared, True

    def _landed(
        self,
        key: str | None,
        shared: _Shared,
        miss: Miss,
        response: dict[str, Any] | None,
        upstream_s: float,
    ) -> None:
        if key is not None and self._flights.get(key) is shared:
            del self._flights[key]
        self.router.finished(shared.replica)
        if response is None:
            self.cache.abandon(miss)
            return
        produced_by = self.tracker.observe_response(miss.request.model, response)
        if not self.upstreams[shared.replica].records_prefix_metrics:
            self._count_prefix(response)
        shared.completion = self.cache.finish(
            miss, response, upstream_s=upstream_s, produced_by=produced_by
        )

    def _count_prefix(self, response: dict[str, Any]) -> None:
        prompt_tokens, _ = usage_tokens(response)
        reused = cached_tokens(response)
        self._prefix.prompt_tokens(prompt_tokens)
        if reused > 0:
            model = str(response.get("model", ""))
            self._prefix.hit(
                prompt_tokens=reused,
                completion_tokens=0,
                upstream_s=0.0,  # an HTTP upstream does not say how long the reuse saved
                money_usd=self.cache.metrics.prices.prefix_savings_usd(model, reused),
            )
        else:
            self._prefix.miss(MissReason.ABSENT)

    # -- bookkeeping --

    def _write_log(
        self,
        trace: _Trace,
        *,
        status: int,
        layer: str | None = None,
        response: dict[str, Any] | None = None,
    ) -> None:
        if self._log is None:
            return
        prompt_tokens, completion_tokens = usage_tokens(response) if response else (0, 0)
        record = {
            "timestamp": trace.started_s,
            "tenant": trace.tenant,
            "model": trace.body.get("model"),
            "layer": layer or trace.record.get("layer"),
            "status": status,
            "stream": trace.body.get("stream") is True,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens(response) if response else 0,
            "latency_ms": round((self._clock.monotonic_s() - trace.started_mono_s) * 1000, 3),
        }
        digest = None
        if self._log.redact:
            digest = "sha256:" + hashlib.sha256(canonical_json(trace.body)).hexdigest()
        self._log.write(record, request=trace.body, digest=digest, response=response)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.cache.metrics.snapshot())
        try:
            store = self.cache.backend.stats()
            out["store"] = {
                "url": self.cache.backend.url,
                "entries": store.entries,
                "bytes": store.bytes,
                "max_bytes": store.max_bytes,
            }
        except InfercacheError as exc:
            out["store"] = {"url": self.cache.backend.url, "error": str(exc)}
        out["upstreams"] = [
            {"name": u.name, "in_flight": n}
            for u, n in zip(self.upstreams, self.router.in_flight(), strict=True)
        ]
        out["model_swaps"] = self.tracker.swaps
        out["flights"] = len(self._flights)
        out["waiting"] = sum(shared.waiters for shared in self._flights.values())
        return out

    async def aclose(self) -> None:
        for upstream in self.upstreams:
            await upstream.aclose()
        if self._log is not None:
            self._log.close()
