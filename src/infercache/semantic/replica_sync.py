"""Semantic entries shared across replicas: every gateway on one Redis (or Redis Cluster)
follows the feed of semantic-index changes (stores/feed.py), so an entry stored through one
replica is a candidate on the others within one blocking read.

Publishing is the layer's (layer.py): `ADD {exact key}` after its record is written, `REMOVE
{exact key}` when a complaint retires it. Following is `ReplicaSync`'s, one daemon thread that
drives `FeedFollower` (the feed's consumer contract):
1. Start: the feed's tail is taken *before* the store is scanned. `attach` takes it before the
   layer's start-up rebuild, so a replica's start costs one scan; when that rebuild failed (the
   store was down) the thread starts afresh: tail, then `rebuild(replace=True)`.
2. `ADD key`: read the record `sem:{key}` from the store. Absent, expired, unreadable or of
   another embedder: the key's vector is dropped (the entry went meanwhile). The same item
   already indexed (this replica's own add coming back, or an event read twice): nothing.
   Otherwise its vector joins its scope's index. Idempotent.
3. `REMOVE key`: its vector is dropped. `INVALIDATE`: nothing — candidates are checked on read.
4. A gap (events trimmed, the server emptied): `rebuild(replace=True)`, a complete new index
   swapped in, so what was deleted meanwhile goes too.
5. A `StoreError` is counted (`feed_errors`), logged, and the step retried after a backoff
   (0.1 s doubling to 5 s); the replica serves from the index it has meanwhile.
Correctness never rests on the feed: a lagging replica checks every candidate against the
store on read (`ExactCache.live_entry`: TTL, model version, tag generations), so it may miss a
new entry but never serves an invalidated or removed one.

`close()` stops the thread (it wakes within `block_ms`) and closes the feed's client; the layer
calls it from its own `close()`. Which stores get a feed: `wants_sync(url)` — Redis and Redis
Cluster. The memory store is one process's; a SQLite file shared by processes on one host has
no feed: each sees the others' entries at its next start.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import KW_ONLY, InitVar, dataclass, field

from infercache.errors import StoreError
from infercache.semantic.layer import SemanticLayer
from infercache.stores.feed import Feed, FeedEvent, FeedFollower, FeedKind, open_feed, reached
from infercache.stores.redis_connect import is_redis_url

log = logging.getLogger(__name__)

BLOCK_MS = 500  # one blocking read; also how long `close` may wait for the thread
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
PUBLISH_TIMEOUT_S = 1.0  # a publisher never blocks: its socket times out early


def wants_sync(store_url: str) -> bool:
    """Can replicas share semantic entries through this store (Redis, Redis Cluster)?"""
    return is_redis_url(store_url)


@dataclass(eq=False, repr=False, slots=True)
class ReplicaSync:
    """`position`: a tail taken before the layer's last successful rebuild (resume from it);
    None: start afresh in the thread (tail, then rebuild)."""

    layer: SemanticLayer
    feed: Feed
    _: KW_ONLY
    block_ms: int = BLOCK_MS
    position: InitVar[str | None] = None
    follower: FeedFollower = field(init=False)
    applied: int = field(init=False, default=0)  # events applied
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _progress: threading.Condition = field(init=False, default_factory=threading.Condition)
    _thread: threading.Thread = field(init=False)

    def __post_init__(self, position: str | None) -> None:
        layer = self.layer
        self.follower = FeedFollower(
            self.feed, rebuild=lambda: layer.rebuild(replace=True), apply=self.apply
        )
        if position is not None:
            self.follower.resume(position)
        self._thread = threading.Thread(
            target=self._run, name="infercache-replica-sync", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def apply(self, event: FeedEvent) -> None:
        """One event of the feed (idempotent). Raises StoreError."""
        layer = self.layer
        if event.kind is FeedKind.REMOVE:
            layer.indexes.forget_key(event.key)
        elif event.kind is FeedKind.ADD:
            layer.refresh_key(event.key)
        else:
            return
        self.applied += 1
        layer.metrics.count("feed_applied")
        layer.metrics.gauge("vectors", len(layer.indexes))

    def caught_up(self, position: str, timeout_s: float) -> bool:
        """Wait until the feed has been applied up to `position` (a published event's); False
        if it has not within `timeout_s`."""
        with self._progress:
            return self._progress.wait_for(
                lambda: reached(self.follower.position, position), timeout_s
            )

    def _run(self) -> None:
        backoff_s = MIN_BACKOFF_S
        while not self._stop.is_set():
            try:
                if self.follower.position is None:
                    self.follower.start()
                self.follower.poll(block_ms=self.block_ms)
                backoff_s = MIN_BACKOFF_S
            except StoreError as exc:
                self.layer.metrics.count("feed_errors")
                log.warning("semantic feed: %s (retrying in %.1f s)", exc, backoff_s)
                self._stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)
            with self._progress:
                self._progress.notify_all()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.feed.close()


def attach(
    layer: SemanticLayer, store_url: str, position: str | None, *, block_ms: int = BLOCK_MS
) -> ReplicaSync:
    """Publish `layer`'s changes to the feed beside `store_url` and follow it in a thread
    (closed with the layer). `position`: `tail_before_rebuild`'s answer."""
    publisher = open_feed(store_url, max_block_ms=0, socket_timeout_s=PUBLISH_TIMEOUT_S)
    follower = open_feed(store_url, max_block_ms=block_ms)
    sync = ReplicaSync(
        layer, follower, block_ms=block_ms, position=position if layer.rebuilds else None
    )
    layer.feed = publisher
    layer.on_close(publisher.close)
    layer.on_close(sync.close)  # closed first: the thread stops before its feed goes
    sync.start()
    return sync


def tail_before_rebuild(store_url: str) -> str | None:
    """The feed's tail, taken before the layer's start-up rebuild (None: unreadable now; the
    sync then starts afresh)."""
    feed = open_feed(store_url, max_block_ms=0, socket_timeout_s=PUBLISH_TIMEOUT_S)
    try:
        return feed.tail()
    except StoreError as exc:
        log.warning("semantic feed unreadable at start, the sync will rebuild: %s", exc)
        return None
    finally:
        feed.close()
