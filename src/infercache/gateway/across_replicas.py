"""One upstream call per key across gateway replicas sharing a Redis store.

The local flight (flight.py) makes one call per key in this process; its leader then asks the
replica flights (stores/replica_flight.py) before calling upstream:

    join(miss) → None                 no shared Redis, its breaker is open, or Redis failed:
                                      fetch alone (a replica flight is an optimisation)
               → SharedAnswer         another replica fetched it: serve that, as a coalesced hit
               → FlightLease          this replica fetches; `publish` the answer when whole,
                                      or hand the lease over (a waiter elsewhere takes over)

The flight key is the exact key *and* the model version token and tag generations its lookup
saw, so an answer published before a model swap or an invalidation can never answer a request
looked up after it. An answer stays readable `answer_ttl_ms` (5 s) after it is published, for
requests that were in flight elsewhere; the exact store holds it for longer. Errors the request
itself caused (4xx) are published so that waiters fail alike; a replica failure (5xx,
unreachable) hands the lease over instead, so another gateway tries its own upstreams.
"""

from __future__ import annotations

import hashlib
import logging

from infercache.errors import StoreError, StoreUnavailableError, UpstreamError
from infercache.keys import canonical_json
from infercache.miss import Miss
from infercache.store_guard import GuardedBackend
from infercache.stores.replica_flight import FlightLease, ReplicaFlights, SharedAnswer

log = logging.getLogger(__name__)


class AcrossReplicas:
    def __init__(
        self,
        flights: ReplicaFlights,
        *,
        guard: GuardedBackend | None,
        wait_s: float,
    ) -> None:
        self._flights = flights
        self._guard = guard
        self._wait_s = wait_s

    @staticmethod
    def key(miss: Miss) -> str | None:
        lookup = miss.lookup
        if miss.flight_key is None or lookup is None or lookup.view is None:
            return None
        scoped = canonical_json([lookup.key, lookup.view.model_version, lookup.view.tags])
        return hashlib.sha256(scoped).hexdigest()

    async def join(self, miss: Miss) -> SharedAnswer | FlightLease | None:
        key = self.key(miss)
        if key is None or (self._guard is not None and self._guard.breaker.state != "closed"):
            return None
        try:
            return await self._flights.join(key, timeout_s=self._wait_s)
        except StoreUnavailableError as exc:  # a cluster node skipped: its breaker logs
            log.debug("replica flight skipped, fetching alone: %s", exc)
            return None
        except StoreError as exc:
            log.warning("replica flight unavailable, fetching alone: %s", exc)
            return None

    @staticmethod
    async def publish(lease: FlightLease, response: dict[str, object]) -> None:
        try:
            await lease.close(SharedAnswer.of_completion(response))
        except StoreError as exc:
            log.warning("could not publish flight %s (its lease expires): %s", lease.key, exc)

    @staticmethod
    async def fail(lease: FlightLease, error: BaseException) -> None:
        """The leader's call failed: share the request's own error, else hand over."""
        own_fault = isinstance(error, UpstreamError) and 400 <= error.status_code < 500
        try:
            if own_fault:
                assert isinstance(error, UpstreamError)
                await lease.close(SharedAnswer.of_error(error.status_code, error.to_openai()))
            else:
                await lease.close(None)
        except StoreError as exc:
            log.warning("could not close flight %s (its lease expires): %s", lease.key, exc)

    async def aclose(self) -> None:
        await self._flights.aclose()
