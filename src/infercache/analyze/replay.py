"""Replay: the log, in time order, through the real layer code, as one simulated deployment.

A `Replay` runs, per request:
1. `cache.Cache.begin` (when the setup has a cache): parse, policy, exact lookup and, when
   enabled (`Cache.enable_semantic`), the semantic lookup: the production request path. The
   cache sits on a `memory://` store bounded by `exact_capacity_bytes` (LRU, expired first),
   with the TTL as `default_ttl_s`, on a `ManualClock` set to each request's timestamp: TTLs
   expire as they would have. A `Completion` is a hit: its layer and age are recorded.
2. A `Miss` goes "upstream". Below the caches, the engine's prefix reuse is accounted over its
   radix tree (simulated_prefix_cache.py) with a KV budget of `prefix_capacity_tokens`; a
   setup without a cache sends every request there (KV reuse alone).
3. `Cache.finish` with the logged response (or, when the log has none, a complete answer
   carrying the known token counts and ~4 bytes of text per completion token, so the store
   fills as it would) and the upstream seconds: measured when the log has them, else the
   latency model's estimate less the prefill that prefix reuse saved. The exact store and the
   semantic index learn the answer exactly as they do live.
Metrics: the cache's own `Metrics` (strategies `exact`, `semantic`) plus `prefix`, fed as
engine/accounting.py does: a lookup per upstream request, a hit when any prompt token is
reused, seconds saved = reused tokens at the latency model's prefill rate, money =
`PriceTable.prefix_savings_usd`. Exact sits on top, so its figures are the same alone and
layered; the semantic figures are what it adds below exact.
Requests without a body (redacted lines, block traces) skip the caches: only prefix applies.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from infercache.analyze.census import DISTANCE_BOUNDS_S, Bins
from infercache.analyze.options import AnalyzeOptions, LatencyModel
from infercache.analyze.prepared_request import PreparedRequest
from infercache.analyze.simulated_prefix_cache import SimulatedPrefixCache, kv_namespace
from infercache.cache import Cache, Completion, Layer
from infercache.clock import ManualClock
from infercache.errors import InvalidRequestError, NotCachedError
from infercache.metrics import Metrics, MissReason, PriceTable
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory
from infercache.semantic.layer import SemanticConfig
from infercache.settings import Settings


@dataclass(frozen=True, slots=True)
class ReplaySetup:
    name: str
    ttl_s: float
    exact_capacity_bytes: int | None  # None: no cache above the upstream
    prefix_capacity_tokens: int | None  # None: no prefix accounting
    semantic: bool = False


@dataclass(frozen=True, slots=True)
class SemanticParts:
    """What the replay's semantic layer is built from (one embedder shared by all replays)."""

    embedder: Embedder
    config: SemanticConfig
    guards: tuple[Guard, ...]
    index_factory: IndexFactory | None = None


@dataclass
class Totals:
    """What the replayed requests cost with no cache at all."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    upstream_s: float = 0.0
    cost_usd: float = 0.0
    estimated_upstream: int = 0  # requests whose upstream seconds are the model's estimate
    completion_unknown: int = 0  # requests whose completion tokens the log does not give


@dataclass
class ReplayResult:
    setup: ReplaySetup
    strategies: dict[str, dict[str, Any]]  # Metrics.snapshot()["strategies"]
    served: Counter[str]  # requests answered by each cache layer
    ages: dict[str, Bins]  # age of served entries by layer
    max_age_s: dict[str, float]
    totals: Totals
    skipped: Counter[str]  # requests the caches could not replay, by why


def synthetic_response(model: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-replay",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * (4 * completion_tokens)},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class Replay:
    def __init__(
        self,
        setup: ReplaySetup,
        *,
        settings: Settings,
        options: AnalyzeOptions,
        semantic: SemanticParts | None = None,
    ) -> None:
        if setup.semantic and semantic is None:
            raise ValueError(f"replay {setup.name} needs the semantic parts")
        self.setup = setup
        self._settings = settings
        self._options = options
        self._latency: LatencyModel = options.latency
        self._semantic = semantic if setup.semantic else None
        self._prices: PriceTable = settings.prices
        self.metrics = Metrics(self._prices)
        self._prefix = (
            None
            if setup.prefix_capacity_tokens is None
            else SimulatedPrefixCache(capacity_tokens=setup.prefix_capacity_tokens)
        )
        self._clock: ManualClock | None = None
        self._cache: Cache | None = None
        self._served: Counter[str] = Counter()
        self._ages = {layer: Bins(DISTANCE_BOUNDS_S) for layer in ("exact", "semantic")}
        self._max_age_s = {"exact": 0.0, "semantic": 0.0}
        self._totals = Totals()
        self._skipped: Counter[str] = Counter()

    def _start(self, event: PreparedRequest) -> None:
        """Build the clock (and cache) at the first request's time."""
        self._clock = ManualClock(start_s=event.timestamp_s or 0.0)
        if self.setup.exact_capacity_bytes is None:
            return
        settings = replace(
            self._settings,
            store_url="memory://",
            max_store_bytes=self.setup.exact_capacity_bytes,
            default_ttl_s=self.setup.ttl_s,
            max_ttl_s=max(self._settings.max_ttl_s, self.setup.ttl_s),
        )
        self._cache = Cache(settings, clock=self._clock, metrics=self.metrics)
        if self._semantic is not None:
            s = self._semantic
            self._cache.enable_semantic(
                s.embedder, config=s.config, guards=s.guards, index_factory=s.index_factory
            )

    def observe(self, event: PreparedRequest) -> None:
        if self._clock is None:
            self._start(event)
        assert self._clock is not None
        if event.timestamp_s is not None:
            self._clock.set_now(event.timestamp_s)
        prompt = event.prompt_tokens or 0
        completion = event.completion_tokens or 0
        full_s = self._count_totals(event, prompt, completion)
        if self._cache is None or event.body is None:
            if self._cache is not None:
                self._skipped[f"no request body ({event.kind})"] += 1
            self._upstream(event, prompt)
            return
        try:
            outcome = self._cache.begin(event.body, tenant=event.tenant_override)
        except NotCachedError:
            self._skipped["only-if-cached and not cached"] += 1
            return
        except InvalidRequestError as exc:  # e.g. contradictory cache_control directives
            self._skipped[f"refused by the cache: {exc.message}"] += 1
            return
        if isinstance(outcome, Completion):
            self._serve(outcome)
            return
        saved_s = self._latency.prefill_s(self._upstream(event, prompt))
        upstream_s = event.upstream_s if event.upstream_s is not None else full_s - saved_s
        self._cache.finish(
            outcome, self._response(event, prompt, completion), upstream_s=upstream_s
        )

    def _count_totals(self, event: PreparedRequest, prompt: int, completion: int) -> float:
        t = self._totals
        t.requests += 1
        t.prompt_tokens += prompt
        t.completion_tokens += completion
        t.completion_unknown += event.completion_tokens is None
        if event.upstream_s is not None:
            full_s = event.upstream_s
        else:
            full_s = self._latency.upstream_s(prompt, completion)
            t.estimated_upstream += 1
        t.upstream_s += full_s
        t.cost_usd += self._prices.cost_usd(event.model, prompt, completion)
        return full_s

    def _serve(self, done: Completion) -> None:
        layer = done.layer.value
        self._served[layer] += 1
        if done.layer in (Layer.EXACT, Layer.SEMANTIC) and done.age_s is not None:
            self._ages[layer].add(done.age_s)
            self._max_age_s[layer] = max(self._max_age_s[layer], done.age_s)

    def _upstream(self, event: PreparedRequest, prompt: int) -> int:
        """The request reaches the engine: account its prefix reuse; return reused tokens."""
        if self._prefix is None or event.units is None or not prompt:
            return 0
        assert self._clock is not None
        namespace = kv_namespace(
            event.tenant,
            event.model,
            share_across_tenants=self._options.share_prefix_across_tenants,
        )
        reuse = self._prefix.observe(
            namespace,
            event.units,
            unit_tokens=event.unit_tokens,
            prompt_tokens=prompt,
            now_s=self._clock.now_s(),
        )
        metrics = self.metrics.strategy("prefix")
        metrics.prompt_tokens(prompt)
        reused = reuse.reused_tokens
        if reused > 0:
            metrics.hit(
                prompt_tokens=reused,
                completion_tokens=0,
                upstream_s=self._latency.prefill_s(reused),
                money_usd=self._prices.prefix_savings_usd(event.model, reused),
            )
        else:
            metrics.miss(MissReason.ABSENT)
        return reused

    @staticmethod
    def _response(event: PreparedRequest, prompt: int, completion: int) -> dict[str, Any]:
        if event.response is None:
            return synthetic_response(event.model, prompt, completion)
        if isinstance(event.response.get("usage"), dict):
            return event.response
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        return {**event.response, "usage": usage}

    def result(self) -> ReplayResult:
        strategies = self.metrics.snapshot()["strategies"]
        if self._prefix is not None:
            stats = self._prefix.stats()
            prefix = self.metrics.strategy("prefix")
            prefix.gauge("kv_tokens", stats.cached_tokens)
            prefix.gauge("evicted_tokens", stats.evicted_tokens)
            strategies = self.metrics.snapshot()["strategies"]
        return ReplayResult(
            self.setup,
            strategies,
            self._served,
            self._ages,
            self._max_age_s,
            self._totals,
            self._skipped,
        )

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
