"""The exact-match layer: a hit is an entry under the request's exact key that is fresh.

Lookup: derive the key (keys.py), read the version view (one meta read: the model's version
token and the generations of the request's tags), read the entry. The entry is served only if
it is fresh (freshness.py: unexpired, produced under the current model version token, every
tag it depends on still at the generation it recorded, and no older than the request's
max-age). A stale entry found on read is deleted (lazy reclamation) and the miss is attributed
to its reason.

A request looked up under a retired version (versions.py) is a `retired_version` miss: its
entry is neither served nor deleted (a rollback revives it).

Store: a complete response (policy.unstorable_reason) is written with the view seen *at lookup*,
so an answer generated across a model swap or an invalidation is never served. An entry belongs
to the version that produced it: an answer of another version than the request was looked up
under (a retried call that another replica answered, a replica whose version its answer just
revealed) is stored under that version's key and token (`version=`), read once; never under a
retired version.

Failure: a `StoreError` on lookup is a `store_error` miss; on store it is counted and logged.
Neither reaches the caller. This class records store errors and lookup overhead; the caller
(cache.py) records the hit or miss once it knows the outcome (coalesced waiters count as hits).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NamedTuple

import orjson

from infercache.clock import Clock
from infercache.errors import StoreError, StoreUnavailableError
from infercache.freshness import stale_reason, too_old
from infercache.keys import IGNORABLE_FIELDS, exact_key
from infercache.metrics import MissReason, StrategyMetrics
from infercache.policy import CachePolicy, unstorable_reason, usage_tokens
from infercache.request import ChatRequest
from infercache.stores.base import Backend, Entry
from infercache.versions import Versions, VersionView, generation_of, meta_names, view_from

log = logging.getLogger(__name__)


class _Same:
    """`ExactCache.store`'s default `version`: the one the request was looked up under."""


SAME = _Same()


class Stored(NamedTuple):
    """Where an answer was stored: its key and the view it was stored under."""

    key: str
    view: VersionView


class Lookup(NamedTuple):  # a NamedTuple, not a frozen dataclass: built on every request
    key: str
    view: VersionView | None  # None when the store could not be read
    entry: Entry | None  # the fresh entry on a hit
    miss_reason: MissReason | None  # None on a hit

    @property
    def hit(self) -> bool:
        return self.entry is not None


@dataclass(eq=False, repr=False)
class StoreLayer:
    """What a cache layer over a store holds (this exact layer, embeddings/embedding_cache.py):
    the store, the version meta read through it, its TTL policy, clock and metrics, and the
    body fields its keys ignore."""

    backend: Backend
    _: KW_ONLY
    policy: CachePolicy
    clock: Clock
    metrics: StrategyMetrics
    ignorable_fields: frozenset[str] = IGNORABLE_FIELDS
    versions: Versions = field(init=False)

    def __post_init__(self) -> None:
        self.versions = Versions(self.backend)


# Not slotted: a test replaces `store` on an instance to make storing fail.
@dataclass(eq=False, repr=False)
class ExactCache(StoreLayer):
    def key(self, request: ChatRequest) -> str:
        return exact_key(request, self.ignorable_fields)

    def lookup(self, request: ChatRequest, *, read_entry: bool = True) -> Lookup:
        """Find a fresh entry. With `read_entry=False` only the view is read (a refresh)."""
        started = self.clock.monotonic_s()
        key = self.key(request)
        tags, version = request.directives.tags, request.version
        try:
            if read_entry:
                names = meta_names(request.model, tags, version)
                entry, meta = self.backend.get_with_meta(key, names)
                view = view_from(meta, request.model, tags, version)
            else:
                entry, view = None, self.versions.view(request.model, tags, version)
        except StoreError as exc:
            self.store_failed("lookup", exc)
            self.metrics.overhead(self.clock.monotonic_s() - started)
            unavailable = isinstance(exc, StoreUnavailableError)
            why = MissReason.STORE_UNAVAILABLE if unavailable else MissReason.STORE_ERROR
            return Lookup(key, None, None, why)
        reason: MissReason | None = MissReason.ABSENT
        if view.retired:  # kept for a rollback: neither served nor deleted
            entry, reason = None, MissReason.RETIRED_VERSION
        if entry is not None:
            now_s = self.clock.now_s()
            reason = stale_reason(entry, view, now_s)
            if reason is not None:
                self._delete(key)
            elif too_old(entry, now_s, request.directives.max_age_s):
                reason = MissReason.EXPIRED  # fresh for others (kept), too old for this caller
        self.metrics.overhead(self.clock.monotonic_s() - started)
        return Lookup(key, view, entry if reason is None else None, reason)

    def fresh_entry(self, key: str, view: VersionView, max_age_s: float | None) -> Entry | None:
        """The entry under `key` if it would be a hit for a request that saw `view` and accepts
        answers up to `max_age_s` old (the semantic layer's check of a candidate). Raises
        StoreError."""
        entry = self.live_entry(key, view)
        return None if entry is None or self.too_old_for(entry, max_age_s) else entry

    def live_entry(self, key: str, view: VersionView) -> Entry | None:
        """The entry under `key` if it is valid for requests that saw `view` (unexpired, its
        model version and tag generations current); None when it is gone for all of them,
        whatever max-age one of them asks for. Raises StoreError."""
        entry = self.backend.get(key)
        if entry is None or stale_reason(entry, view, self.clock.now_s()) is not None:
            return None
        return entry

    def too_old_for(self, entry: Entry, max_age_s: float | None) -> bool:
        """Older than one request's max-age: a miss for it, still fresh for the others."""
        return too_old(entry, self.clock.now_s(), max_age_s)

    def store(
        self,
        lookup: Lookup,
        request: ChatRequest,
        response: Mapping[str, Any],
        *,
        upstream_s: float,
        produced_by: str | None = None,
        version: str | _Same | None = SAME,
    ) -> Stored | None:
        """Store `response` for `request` if it is complete; where it was stored (None: not
        stored).

        `version`: the model version that produced the answer, when it is not the one the
        request was looked up under (the module docstring). `produced_by` (unversioned
        requests): the version label the upstream reports (its system_fingerprint); the entry is
        recorded under the token the lookup saw when that is the version that produced it; else
        under the current token if the producer is current now (the swap was recorded
        meanwhile); else not at all. Without either, under what the lookup saw.
        """
        if lookup.view is None:
            return None
        why_not = unstorable_reason(response, request.endpoint)
        if why_not is not None:
            self.metrics.count("not_stored")
            log.debug("not storing %s: %s", lookup.key, why_not)
            return None
        started = self.clock.monotonic_s()
        try:
            where = self._where(lookup, lookup.view, request, produced_by, version)
            if where is None:
                self.metrics.count("not_stored")
                return None
            self.backend.put(where.key, self._entry(request, response, where.view, upstream_s))
        except StoreError as exc:
            self.store_failed("store", exc)
            return None
        finally:
            self.metrics.overhead(self.clock.monotonic_s() - started)
        self.metrics.count("stored")
        return where

    def _where(
        self,
        lookup: Lookup,
        view: VersionView,
        request: ChatRequest,
        produced_by: str | None,
        version: str | _Same | None,
    ) -> Stored | None:
        """The key and view an answer is stored under (None: nowhere). Raises StoreError."""
        if not isinstance(version, _Same) and version != request.version:
            return self._rescoped(view, request, version)
        if view.retired:
            return None
        if produced_by is None or request.version is not None:
            return Stored(lookup.key, view)
        # Produced by the version the lookup saw: store under that token (a swap meanwhile
        # leaves it unreachable). Produced by another: only if that one is current now.
        if view.model_version.partition(":")[2] == produced_by:
            return Stored(lookup.key, view)
        current = self.versions.view(request.model, ()).model_version
        if current.partition(":")[2] != produced_by:
            return None
        return Stored(lookup.key, VersionView(current, view.tags))

    def _rescoped(
        self, view: VersionView, request: ChatRequest, version: str | None
    ) -> Stored | None:
        """Under `version`'s key: its token read now, the lookup's model generation and tag
        generations kept (a swap or an invalidation since the lookup leaves it unreachable)."""
        scoped = request._replace(version=version)
        now = self.versions.view(request.model, (), version)
        if now.retired or generation_of(now.model_version) != generation_of(view.model_version):
            return None
        return Stored(self.key(scoped), VersionView(now.model_version, view.tags))

    def _entry(
        self,
        request: ChatRequest,
        response: Mapping[str, Any],
        view: VersionView,
        upstream_s: float,
    ) -> Entry:
        now_s = self.clock.now_s()
        prompt_tokens, completion_tokens = usage_tokens(response)
        return Entry(
            response=orjson.dumps(response),
            model=request.model,
            model_version=view.model_version,
            tags=view.tags,
            created_at_s=now_s,
            expires_at_s=now_s + self.policy.ttl_s(request),
            upstream_s=upstream_s,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    def age_s(self, entry: Entry) -> float:
        return max(0.0, self.clock.now_s() - entry.created_at_s)

    def _delete(self, key: str) -> None:
        try:
            self.backend.delete(key)
        except StoreError as exc:
            self.store_failed("delete", exc)

    def store_failed(self, op: str, exc: StoreError) -> None:
        if isinstance(exc, StoreUnavailableError):  # the guard logs when it starts and stops
            self.metrics.count("store_unavailable")
            log.debug("cache store skipped on %s: %s", op, exc)
            return
        self.metrics.count("store_errors")
        log.warning("cache store failed on %s, serving without it: %s", op, exc)
