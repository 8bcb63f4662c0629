"""Shadow traffic (issue 29 item 3): a share of the requests mirrored to the version being
rolled out, its answers compared with the live ones and recorded, never served or cached.

    offer(tenant, body, live answer, live version)     on the request path: one put_nowait
      queue full (`max_pending`) → dropped, counted; the request is not slowed
    `workers` tasks, off the request path, each:
      the canary upstream the router picks among the rollout's (router.lease, so it is counted
      in flight there), the body as the client sent it but whole (not streamed), with the
      upstream's own key, never the caller's
      its answer's fingerprint noted (versions.py: the canary's version stays known)
      the judges (semantic/judges.py: exact, equality, and embedding when the semantic layer
      has an embedder) compare it with the live answer, in a thread
      one request-log line `"shadow": true` (its version and the live one, each judge's
      verdict, the latency; the request and its answer unless redacting) and the counters
      `/stats` shows (`snapshot`: mirrored, answered, failed, dropped, agreement per judge)

Nothing here touches the cache: a mirrored answer is never stored and no client reads it.
`wait_idle` lets a caller wait until everything offered was answered (tests, shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from infercache.clock import Clock
from infercache.errors import InfercacheError
from infercache.gateway.requestlog import RequestLog
from infercache.gateway.router import PrefixRouter
from infercache.gateway.upstream_protocols import Upstream
from infercache.gateway.versions import ModelVersionTracker
from infercache.semantic.judges import Judge

log = logging.getLogger(__name__)


class _Mirrored(NamedTuple):
    tenant: str
    body: dict[str, Any]
    live: dict[str, Any]
    live_version: str | None
    canary: frozenset[int]


class ShadowMirror:
    def __init__(
        self,
        upstreams: Sequence[Upstream],
        router: PrefixRouter[Any],
        tracker: ModelVersionTracker,
        judges: Callable[[], Sequence[Judge]],
        clock: Clock,
        *,
        request_log: RequestLog | None = None,
        max_pending: int = 256,
        workers: int = 2,
    ) -> None:
        self._upstreams = list(upstreams)
        self._router = router
        self._tracker = tracker
        self._judges = judges  # asked when a comparison runs: the semantic layer may come later
        self._clock = clock
        self._log = request_log
        self._max_pending = max_pending
        self._workers = workers
        self._queue: asyncio.Queue[_Mirrored] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = threading.Condition()
        self._pending = 0
        self.counts = {"mirrored": 0, "answered": 0, "failed": 0, "dropped": 0}
        self._agreement: dict[str, list[int]] = {}  # judge → [same, different]

    def start(self) -> None:
        """On the serving loop: the workers start."""
        self._queue = asyncio.Queue(self._max_pending)
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]

    def offer(
        self,
        tenant: str,
        body: dict[str, Any],
        live: dict[str, Any],
        live_version: str | None,
        canary: frozenset[int],
    ) -> None:
        """Mirror one answered request (on the serving loop; never waits)."""
        if self._queue is None or not canary:
            return
        sent = {k: v for k, v in body.items() if k not in ("infercache", "stream_options")}
        sent.pop("stream", None)
        try:
            self._queue.put_nowait(_Mirrored(tenant, sent, live, live_version, canary))
        except asyncio.QueueFull:
            self.counts["dropped"] += 1
            return
        with self._idle:
            self._pending += 1
        self.counts["mirrored"] += 1

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            item = await self._queue.get()
            try:
                await self._mirror(item)
            except Exception:  # a bug here must not end the worker: logged, counted
                log.exception("shadow traffic failed")
                self.counts["failed"] += 1
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    async def _mirror(self, item: _Mirrored) -> None:
        others = frozenset(range(len(self._upstreams))) - item.canary
        started = self._clock.monotonic_s()
        with self._router.lease(item.tenant, item.body, others) as replica:
            try:
                answer = await self._upstreams[replica].complete(
                    item.body, tenant=item.tenant, api_key=None
                )
            except InfercacheError as exc:
                self.counts["failed"] += 1
                log.info("shadow request to %s failed: %s", self._upstreams[replica].name, exc)
                return
        latency_s = self._clock.monotonic_s() - started
        model = str(item.body.get("model"))
        state = await asyncio.to_thread(self._tracker.answered, replica, model, answer, None)
        verdicts = await asyncio.to_thread(self._judge, item, answer)
        self.counts["answered"] += 1
        if self._log is not None:
            record = {
                "timestamp": self._clock.now_s(),
                "shadow": True,
                "tenant": item.tenant,
                "model": model,
                "upstream": self._upstreams[replica].name,
                "version": state.version,
                "live_version": item.live_version,
                "agreement": verdicts,
                "latency_ms": round(latency_s * 1000, 3),
            }
            await asyncio.to_thread(self._log.write, record, item.body, item.tenant, answer)

    def _judge(self, item: _Mirrored, answer: dict[str, Any]) -> dict[str, bool]:
        verdicts: dict[str, bool] = {}
        for judge in self._judges():
            try:
                same = judge.same(item.body, item.live, answer)
            except Exception as exc:  # noqa: BLE001 - a judge may fail (an embedder): no verdict
                log.info("shadow judge %s gave no verdict: %s", judge.name, exc)
                continue
            verdicts[judge.name] = same
            with self._idle:
                counts = self._agreement.setdefault(judge.name, [0, 0])
                counts[0 if same else 1] += 1
        return verdicts

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every offered request was mirrored (False: `timeout_s` passed)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def snapshot(self) -> dict[str, Any]:
        with self._idle:
            agreement = {
                name: {
                    "same": same,
                    "different": different,
                    "rate": round(same / (same + different), 4) if same + different else None,
                }
                for name, (same, different) in self._agreement.items()
            }
            return {**self.counts, "pending": self._pending, "agreement": agreement}

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # each ends cancelled
