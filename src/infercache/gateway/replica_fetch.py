"""How the gateway reaches its upstreams for a miss: the `Source` it passes to the one miss
protocol (miss_flight.py), which does the rest (settle, store, close).

    fetch(miss, sink):
      across.join(miss)                      one call per key across gateway replicas
        → SharedAnswer: another replica fetched it: a coalesced hit here (an error it
                        shared is raised)                             (across_replicas.py)
        → FlightLease: this replica fetches; once the local readers have the answer it is
                       shared (`Fetched.after`); on failure the lease is handed over
        → None: fetch alone (no shared Redis, or it failed)
      router.lease → a replica, counted in flight while the call runs          (router.py)
        the one the request was placed on when several versions are live (placement.py),
        else the router's pick among the replicas it may go to
        the endpoint's call, streamed or not (endpoints.py); a stream's chunks published as
        they come; a connection the upstream closed before answering (a kept-alive one it
        dropped: upstream_errors.py) is asked once more, nothing ejected; a replica that fails
        before any chunk is ejected and the call tried once more on another (one that cannot
        be reached: its versions in doubt, versions.py)
      the prefix reuse an HTTP upstream reports, counted per upstream (prefix_usage.py); the
      request's first message offered to the live prefix-breaker finder (live_breakers.py)
    observe(miss, response): the answer's fingerprint noted for the replica that gave it
      (versions.py), and the version the answer belongs to set on the miss, so it is stored
      under that version, or not at all while that version is in doubt or retired; then what
      the endpoint keeps of the answer (a Responses conversation); store I/O, run by the
      protocol where store_guard.py says, with the store write
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from infercache.completion import Response
from infercache.errors import UpstreamAbortedError, UpstreamError, UpstreamUnavailableError
from infercache.gateway.across_replicas import AcrossReplicas
from infercache.gateway.endpoints import CachedEndpoint
from infercache.gateway.live_breakers import LiveBreakers
from infercache.gateway.placement import ANYWHERE, Placement
from infercache.gateway.prefix_usage import UpstreamPrefixUsage
from infercache.gateway.router import PrefixRouter
from infercache.gateway.upstream_errors import closed_before_answering
from infercache.gateway.upstream_protocols import Upstream, UpstreamCall
from infercache.gateway.versions import ModelVersionTracker
from infercache.miss import Miss
from infercache.miss_flight import ChunkSink, Fetched
from infercache.policy import unstorable_reason
from infercache.request import Endpoint
from infercache.stores.replica_flight import FlightLease, SharedAnswer

log = logging.getLogger(__name__)


class ReplicaFetch:
    """The gateway's upstreams behind its router, and the replica flights beside them."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        router: PrefixRouter[Upstream],
        *,
        tracker: ModelVersionTracker,
        prefix_usage: UpstreamPrefixUsage,
        across: AcrossReplicas | None,
        endpoints: Mapping[Endpoint, CachedEndpoint],
        breakers: LiveBreakers | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.breakers = breakers or LiveBreakers()
        self.upstreams = list(upstreams)
        self.router = router
        self.tracker = tracker
        self._prefix_usage = prefix_usage
        self._across = across

    def source(self, bearer: str | None, placement: Placement = ANYWHERE) -> CallerSource:
        """The protocol's Source for one caller (its bearer, when forwarded upstream) and
        where its request was placed."""
        return CallerSource(self, bearer, placement)

    async def fetch(self, miss: Miss, sink: ChunkSink, caller: CallerSource) -> Fetched:
        joined = await self._across.join(miss) if self._across is not None else None
        if isinstance(joined, SharedAnswer):  # another gateway replica fetched it
            body = joined.completion()
            if not joined.ok:
                error = body.get("error")
                message = str(error.get("message")) if isinstance(error, dict) else "upstream error"
                raise UpstreamError(message, status_code=joined.status, body=body)
            return Fetched(body, elsewhere=True)
        try:
            upstream, response = await self._call_replicas(miss, sink, caller)
        except BaseException as exc:
            if joined is not None:
                await AcrossReplicas.fail(joined, _failure(exc))
            raise
        self.breakers.observe(miss.request)  # a layout defeating the upstream's prefix cache
        if not upstream.records_prefix_metrics:
            self._prefix_usage.count(upstream.name, response)  # the reuse it reports
        if joined is None:
            return Fetched(response)
        return Fetched(response, after=functools.partial(_share, joined, response))

    async def _call_replicas(
        self, miss: Miss, sink: ChunkSink, caller: CallerSource
    ) -> tuple[Upstream, Response]:
        """The call on the replica placed or picked; when that replica fails before any chunk
        came back (unreachable, timed out, a 5xx), it is ejected and the call goes once to
        another replica."""
        tried: list[int] = []
        placement = caller.placement
        asked_again = False
        while True:
            if placement.replica is not None and not tried:
                lease = self.router.lease_at(placement.replica)
            else:
                tenant, body = miss.request.directives.tenant, miss.request.body
                lease = self.router.lease(tenant, body, [*tried, *placement.exclude])
            with lease as i:
                caller.replica = i
                upstream = self.upstreams[i]
                try:
                    response = await self._call(upstream, miss, sink, caller.bearer)
                except UpstreamError as exc:
                    if not _replica_fault(exc):
                        raise
                    if not (asked_again or sink.published) and closed_before_answering(exc):
                        asked_again = True  # a kept-alive connection closed under us
                        log.info("asking %s again on a new connection", upstream.name)
                        continue
                    self.router.failed(i)
                    if isinstance(exc, UpstreamUnavailableError):
                        self.tracker.unreachable(i)
                    tried.append(i)
                    if sink.published or len(tried) > 1 or len(self.upstreams) == 1:
                        raise
                    log.warning("retrying on another replica after: %s", exc.message)
                    continue
            self.router.succeeded(i)
            return upstream, response

    async def _call(
        self, upstream: Upstream, miss: Miss, sink: ChunkSink, bearer: str | None
    ) -> Response:
        """One upstream call, its chunks published as they come; the complete answer."""
        request = miss.request
        adapter = self.endpoints[request.endpoint]
        call = UpstreamCall(request.directives.tenant, bearer, request.beta)
        body = adapter.sent(dict(request.body), request.stream)
        if not request.stream:
            return await adapter.complete(upstream, body, call)  # whole: no chunk
        assembler = adapter.assembler()
        async for chunk in adapter.stream(upstream, body, call):
            assembler.add(chunk)
            sink.publish(chunk)
        if not assembler.complete:
            raise UpstreamAbortedError("the upstream stream ended before the answer did")
        return assembler.result()


class CallerSource:
    """`ReplicaFetch` for one caller: a miss_flight.Source. `replica`: the one that answered."""

    __slots__ = ("_fetch", "bearer", "placement", "replica")

    def __init__(self, fetch: ReplicaFetch, bearer: str | None, placement: Placement) -> None:
        self._fetch = fetch
        self.bearer = bearer
        self.placement = placement
        self.replica: int | None = None

    def fetch(self, miss: Miss, sink: ChunkSink) -> Coroutine[Any, Any, Fetched]:
        return self._fetch.fetch(miss, sink, self)

    @property
    def upstream(self) -> Upstream | None:
        """The upstream that answered this caller's own call (None: it made none), for the
        request log (gateway/requestlog.py)."""
        return None if self.replica is None else self._fetch.upstreams[self.replica]

    def observe(self, miss: Miss, response: Response) -> None:
        """What the endpoint keeps of the answer; and the answer belongs to its replica's
        version: stored under it, or not at all while that version is in doubt or retired."""
        keep = self._fetch.endpoints[miss.request.endpoint].observe
        if keep is not None:
            keep(miss.request, response)
        if self.replica is None:  # another gateway replica fetched it: nothing to learn
            return
        tracker = self._fetch.tracker
        model = miss.request.model
        seen = miss.lookup.view if miss.lookup is not None else None
        state = tracker.answered(self.replica, model, response, seen)
        miss.version = state.version
        miss.storable = state.known and state.version not in tracker.retired(model)
        if miss.storable and miss.lookup is not None and _stored(miss, response):
            tracker.traffic.stored(model, state.version)


async def _share(lease: FlightLease, response: Response) -> None:
    """Once every local reader has the answer: share it with the other gateway replicas (or
    hand the lease over when that fails)."""
    try:
        await AcrossReplicas.publish(lease, response)
    finally:
        if not lease.closed:
            await AcrossReplicas.fail(lease, UpstreamAbortedError("no answer"))


def _failure(exc: BaseException) -> BaseException:
    """What a failed call hands the replica flight: its error, or an abort when cancelled."""
    if isinstance(exc, Exception):
        return exc
    return UpstreamAbortedError("every client left before the answer completed")


def _stored(miss: Miss, response: Response) -> bool:
    """Whether closing `miss` with `response` stores it (for the per-version counts)."""
    return not miss.request.directives.cache_control.no_store and not unstorable_reason(response)


def _replica_fault(exc: UpstreamError) -> bool:
    """The replica itself failed (not the request): unreachable, timed out, or a 5xx."""
    return isinstance(exc, UpstreamUnavailableError) or exc.status_code >= 500
