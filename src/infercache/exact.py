"""The exact-match layer: a hit is an entry under the request's exact key that is fresh.

Lookup: derive the key (keys.py), read the version view (one meta read: the model's version
token and the generations of the request's tags), read the entry. The entry is served only if
it is fresh (freshness.py: unexpired, produced under the current model version token, every
tag it depends on still at the generation it recorded, and no older than the request's
max-age). A stale entry found on read is deleted (lazy reclamation) and the miss is attributed
to its reason.

Store: a complete response (policy.unstorable_reason) is written with the view seen *at lookup*,
so an answer generated across a model swap or an invalidation is never served.

Failure: a `StoreError` on lookup is a `store_error` miss; on store it is counted and logged.
Neither reaches the caller. This class records store errors and lookup overhead; the caller
(cache.py) records the hit or miss once it knows the outcome (coalesced waiters count as hits).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
from infercache.versions import Versions, VersionView, meta_names, view_from

log = logging.getLogger(__name__)


class Lookup(NamedTuple):  # a NamedTuple, not a frozen dataclass: built on every request
    key: str
    view: VersionView | None  # None when the store could not be read
    entry: Entry | None  # the fresh entry on a hit
    miss_reason: MissReason | None  # None on a hit

    @property
    def hit(self) -> bool:
        return self.entry is not None


class ExactCache:
    def __init__(
        self,
        backend: Backend,
        *,
        policy: CachePolicy,
        clock: Clock,
        metrics: StrategyMetrics,
        ignorable_fields: frozenset[str] = IGNORABLE_FIELDS,
    ) -> None:
        self.backend = backend
        self.versions = Versions(backend)
        self._policy = policy
        self._clock = clock
        self._metrics = metrics
        self.ignorable_fields = ignorable_fields

    def key(self, request: ChatRequest) -> str:
        return exact_key(request, self.ignorable_fields)

    def lookup(self, request: ChatRequest, *, read_entry: bool = True) -> Lookup:
        """Find a fresh entry. With `read_entry=False` only the view is read (a refresh)."""
        started = self._clock.monotonic_s()
        key = self.key(request)
        tags = request.directives.tags
        try:
            if read_entry:
                entry, meta = self.backend.get_with_meta(key, meta_names(request.model, tags))
                view = view_from(meta, request.model, tags)
            else:
                entry, view = None, self.versions.view(request.model, tags)
        except StoreError as exc:
            self.store_failed("lookup", exc)
            self._metrics.overhead(self._clock.monotonic_s() - started)
            unavailable = isinstance(exc, StoreUnavailableError)
            why = MissReason.STORE_UNAVAILABLE if unavailable else MissReason.STORE_ERROR
            return Lookup(key, None, None, why)
        reason: MissReason | None = MissReason.ABSENT
        if entry is not None:
            now_s = self._clock.now_s()
            reason = stale_reason(entry, view, now_s)
            if reason is not None:
                self._delete(key)
            elif too_old(entry, now_s, request.directives.max_age_s):
                reason = MissReason.EXPIRED  # fresh for others (kept), too old for this caller
        self._metrics.overhead(self._clock.monotonic_s() - started)
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
        if entry is None or stale_reason(entry, view, self._clock.now_s()) is not None:
            return None
        return entry

    def too_old_for(self, entry: Entry, max_age_s: float | None) -> bool:
        """Older than one request's max-age: a miss for it, still fresh for the others."""
        return too_old(entry, self._clock.now_s(), max_age_s)

    def store(
        self,
        lookup: Lookup,
        request: ChatRequest,
        response: Mapping[str, Any],
        *,
        upstream_s: float,
        produced_by: str | None = None,
    ) -> VersionView | None:
        """Store `response` for `request` if it is complete; the view it was stored under
        (None: not stored).

        `produced_by`: the model version that generated the answer, when the upstream says
        (its system_fingerprint). The entry is recorded under the token the lookup saw when
        that is the version that produced it; else under the current token if the producer is
        current now (the swap was recorded meanwhile); else not at all. Without it, under the
        token the lookup saw.
        """
        if lookup.view is None:
            return None
        why_not = unstorable_reason(response, request.endpoint)
        if why_not is not None:
            self._metrics.count("not_stored")
            log.debug("not storing %s: %s", lookup.key, why_not)
            return None
        started = self._clock.monotonic_s()
        model_version = lookup.view.model_version
        # Produced by the version the lookup saw: store under that token (a swap meanwhile
        # leaves it unreachable). Produced by another: only if that one is current now.
        if produced_by is not None and model_version.partition(":")[2] != produced_by:
            try:
                current = self.versions.view(request.model, ()).model_version
            except StoreError as exc:
                self.store_failed("store", exc)
                return None
            if current.partition(":")[2] != produced_by:
                self._metrics.count("not_stored")
                return None
            model_version = current
        now_s = self._clock.now_s()
        prompt_tokens, completion_tokens = usage_tokens(response)
        entry = Entry(
            response=orjson.dumps(response),
            model=request.model,
            model_version=model_version,
            tags=lookup.view.tags,
            created_at_s=now_s,
            expires_at_s=now_s + self._policy.ttl_s(request),
            upstream_s=upstream_s,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )
        try:
            self.backend.put(lookup.key, entry)
        except StoreError as exc:
            self.store_failed("store", exc)
            return None
        finally:
            self._metrics.overhead(self._clock.monotonic_s() - started)
        self._metrics.count("stored")
        return VersionView(model_version, lookup.view.tags)

    def age_s(self, entry: Entry) -> float:
        return max(0.0, self._clock.now_s() - entry.created_at_s)

    def _delete(self, key: str) -> None:
        try:
            self.backend.delete(key)
        except StoreError as exc:
            self.store_failed("delete", exc)

    def store_failed(self, op: str, exc: StoreError) -> None:
        if isinstance(exc, StoreUnavailableError):  # the guard logs when it starts and stops
            self._metrics.count("store_unavailable")
            log.debug("cache store skipped on %s: %s", op, exc)
            return
        self._metrics.count("store_errors")
        log.warning("cache store failed on %s, serving without it: %s", op, exc)
