"""Noticing a version change without a miss (issue 29 item 5): every replica's version re-read
in the background, so a change is seen within one poll even when every request is a hit.

    VersionProber(parts, every_s, probe_every_s)   parts: what it reads of one gateway
      round(probe)                      one round, on the serving loop:
      each upstream's /v1/models        a listed `version` is its version (versions.py);
                                        unreachable → every version it served is in doubt
                                        (its cached answers wait until it is read again);
                                        a server that lists no models is left to its answers
      a 1-token chat completion         for each model whose version only this replica's
                                        fingerprints tell (replica_versions.py `to_probe`):
                                        every round while it is in doubt, and every round when
                                        `probe` (the `version_probe_s` period) is due. Its
                                        answer's system_fingerprint is noted like any answer's;
                                        it is never cached
      tracker.sync, rollout.sync        the store's retired versions and rollout (every
                                        gateway on the store follows one another's changes)
      run()                             a round every `every_s` (`version_poll_s`)

Store I/O (retiring, reviving) runs off the loop (store_guard.py's `StoreIO`); the first
round's store reads (before the gateway serves) close what their thread opened (SQLite's
connection: `ThreadResources`), so starting leaves the file as it found it (another process
may still lock it alone), as the start-up store check does.
A probe costs one prompt token and one completion token on a hosted provider;
`version_probe_s` sets how often a reachable replica is probed (the in-doubt ones are probed
every round).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infercache.errors import InfercacheError, UpstreamUnavailableError
from infercache.store_guard import GuardedBackend
from infercache.stores.base import ThreadResources

if TYPE_CHECKING:
    from infercache.gateway.upstream_protocols import Upstream
    from infercache.gateway.versions import ModelVersionTracker
    from infercache.store_guard import StoreIO
    from infercache.stores.base import Backend

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProbedParts:
    """What the prober reads and calls of one gateway (not the gateway itself, which holds
    the prober: the two modules stay one above the other)."""

    upstreams: Sequence[Upstream]
    tracker: ModelVersionTracker
    rollout_sync: Callable[[], None]  # the store's rollout, read again (rollout_control.py)
    store_io: StoreIO
    backend: Backend


def probe_body(model: str) -> dict[str, Any]:
    """The cheapest chat completion whose answer carries a system_fingerprint."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
        "temperature": 0,
    }


class VersionProber:
    """The background reads of one gateway's upstreams (module docstring)."""

    def __init__(
        self,
        parts: ProbedParts,
        every_s: float | None,
        probe_every_s: float | None,
    ) -> None:
        self._parts = parts
        self.every_s = every_s
        self._probe_rounds = (
            max(1, round(probe_every_s / every_s))
            if probe_every_s is not None and every_s is not None
            else None
        )
        self.rounds = 0
        self._ended = threading.Condition()

    async def round(self, *, probe: bool = False, first: bool = False) -> None:
        """One round over every upstream (module docstring). `first`: the one before the
        gateway serves, whose store reads leave no connection open behind them."""
        parts = self._parts
        tracker = parts.tracker
        off_loop = parts.store_io.off_loop
        for replica, upstream in enumerate(parts.upstreams):
            try:
                models = await upstream.models()
            except UpstreamUnavailableError as exc:
                log.info("could not read %s's model versions: %s", upstream.name, exc)
                await off_loop(tracker.unreachable, replica)
                continue
            except InfercacheError as exc:
                log.debug("%s does not list models: %s", upstream.name, exc)
                models = []
            await off_loop(tracker.observe_models, replica, models)
            await self._probe(replica, upstream, due=probe)
        if first:
            await asyncio.to_thread(self._released, tracker.sync, parts.rollout_sync)
        else:
            await off_loop(tracker.sync)
            await off_loop(parts.rollout_sync)
        with self._ended:
            self.rounds += 1
            self._ended.notify_all()

    def _released(self, *reads: Callable[[], None]) -> None:
        """`reads`, in this thread, which then closes what it opened on the store."""
        backend = self._parts.backend
        inner = backend.inner if isinstance(backend, GuardedBackend) else backend
        try:
            for read in reads:
                read()
        finally:
            if isinstance(inner, ThreadResources):
                inner.release_thread()

    async def _probe(self, replica: int, upstream: Upstream, *, due: bool) -> None:
        tracker = self._parts.tracker
        off_loop = self._parts.store_io.off_loop
        for model in tracker.replicas.to_probe(replica, due=due):
            try:
                answer = await upstream.complete(probe_body(model), tenant="", api_key=None)
            except UpstreamUnavailableError:
                await off_loop(tracker.unreachable, replica)
                return
            except InfercacheError as exc:
                log.info("%s did not answer a version probe: %s", upstream.name, exc)
                continue
            await off_loop(tracker.answered, replica, model, answer, None)

    async def run(self) -> None:
        """A round every `every_s`, a probe every `probe_every_s`, until cancelled."""
        if self.every_s is None:
            return
        n = 0
        while True:
            await asyncio.sleep(self.every_s)
            n += 1
            due = self._probe_rounds is not None and n % self._probe_rounds == 0
            try:
                await self.round(probe=due)
            except Exception:  # a round that failed is logged; the next one runs
                log.exception("reading the upstreams' versions failed")

    def wait_rounds(self, n: int, timeout_s: float) -> bool:
        """Block (another thread) until `n` rounds ended since the start; False on timeout."""
        with self._ended:
            return self._ended.wait_for(lambda: self.rounds >= n, timeout_s)
