"""Replay: the log, in time order, through the real layer code, as one simulated deployment.

A `Replay` runs, per request:
1. `cache.Cache.begin` (when the setup has a cache): parse, policy, exact lookup and, when
   enabled (`Cache.enable_semantic`), the semantic lookup: the production request path. The
   cache sits on a `memory://` store bounded by `exact_capacity_bytes` (LRU, expired first),
   with the TTL as `default_ttl_s`, on a `ManualClock` set to each request's timestamp: TTLs
   expire as they would have. A `Completion` is a hit: its layer and age are recorded.
   A redacted request is replayed through its stand-in body (prepared_request.py): the cache
   serves it exactly when its key digest repeats. The store (replay_store.py) keeps a compact
   copy of each answer's bytes and drops an entry once it expires.
2. A `Miss` goes "upstream". Below the caches, the engine's prefix reuse is accounted: over a
   radix tree of its own (simulated_prefix_cache.py) with a KV budget of
   `prefix_capacity_tokens`, or, when the budget is unbounded and no semantic layer sits above,
   with the reuse the census's unbounded tree measured for the same request. That is exact:
   a request the exact cache answers has the tokens of the earlier request it repeats, which
   did reach the engine, so an unbounded tree below the cache holds the same prefixes as one
   that saw every request. A setup without a cache sends every request there (KV reuse alone).
3. `Cache.finish` with the logged response (or, when the log has none, a complete answer
   carrying the known token counts and ~4 bytes of text per completion token, so the store
   fills as it would). The exact store and the semantic index learn the answer exactly as
   they do live.
Metrics: the cache's own `Metrics` (strategies `exact`, `semantic`) plus `prefix`, fed as
engine/accounting.py does: a lookup per upstream request, a hit when any prompt token is
reused, money = `PriceTable.prefix_savings_usd` (the cached-input price). Seconds go to
`SecondsLedger`s (cost_model.py), priced when the log's rates are known: a hit saves the
upstream call that produced the answer it serves (its measured seconds travel with the stored
answer under `MEASURED_S_KEY`; unmeasured, it is estimated from the answer's tokens), prefix
reuse saves the prefill of the reused tokens. Exact sits on top, so its figures are the
same alone and layered; the semantic figures are what it adds below exact.
With `window_s`, the requests, hits and prefix tokens are also counted per window of time.
Block traces have no body: they skip the caches, only prefix applies.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from infercache.analyze.census import DISTANCE_BOUNDS_S, Bins
from infercache.analyze.cost_model import SecondsLedger
from infercache.analyze.prepared_request import PreparedRequest
from infercache.analyze.replay_store import CompactMemoryStore
from infercache.analyze.simulated_prefix_cache import SimulatedPrefixCache
from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Completion, Layer
from infercache.engine.kv_namespace import logged_namespace
from infercache.errors import InvalidRequestError, NotCachedError
from infercache.metrics import Metrics, MissReason, PriceTable
from infercache.miss_flight import close_fetched
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory
from infercache.semantic.layer import SemanticConfig
from infercache.settings import Settings

CENSUS = "census"  # the prefix source that reads the census's reuse
TREE = "tree"  # ... that keeps a tree of its own at `prefix_capacity_tokens`
ANSWER_LAYERS = ("exact", "semantic")
MEASURED_S_KEY = "x_replay_measured_s"  # on stored answers: the producing call's seconds


@dataclass(frozen=True, slots=True)
class ReplaySetup:
    name: str
    ttl_s: float
    exact_capacity_bytes: int | None  # None: no cache above the upstream
    prefix: str | None  # CENSUS, TREE, or None: no prefix accounting
    prefix_capacity_tokens: int | None = None  # TREE's budget; None: unbounded
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
    seconds: SecondsLedger = field(default_factory=SecondsLedger)
    cost_usd: float = 0.0
    completion_unknown: int = 0  # requests whose completion tokens the log does not give


@dataclass
class ReplayResult:
    setup: ReplaySetup
    strategies: dict[str, dict[str, Any]]  # Metrics.snapshot()["strategies"]
    seconds_saved: dict[str, SecondsLedger]  # by strategy
    served: Counter[str]  # requests answered by each cache layer
    ages: dict[str, Bins]  # age of served entries by layer
    max_age_s: dict[str, float]
    totals: Totals
    skipped: Counter[str]  # requests the caches could not replay, by why
    by_window: dict[int, Counter[str]]  # window → requests, exact, semantic, prefix tokens


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
        share_prefix_across_tenants: bool = False,
        window_s: float | None = None,
        semantic: SemanticParts | None = None,
    ) -> None:
        if setup.semantic and semantic is None:
            raise ValueError(f"replay {setup.name} needs the semantic parts")
        if setup.semantic and setup.prefix == CENSUS:
            raise ValueError("a semantic layer above changes what reaches the engine: use TREE")
        self.setup = setup
        self._settings = settings
        self._share = share_prefix_across_tenants
        self._window_s = window_s
        self._semantic = semantic if setup.semantic else None
        self._prices: PriceTable = settings.prices
        self.metrics = Metrics(self._prices)
        self._tree = (
            SimulatedPrefixCache(capacity_tokens=setup.prefix_capacity_tokens)
            if setup.prefix == TREE
            else None
        )
        self._clock: ManualClock | None = None
        self._cache: Cache | None = None
        self._served: Counter[str] = Counter()
        self._ages = {layer: Bins(DISTANCE_BOUNDS_S) for layer in ANSWER_LAYERS}
        self._max_age_s = {layer: 0.0 for layer in ANSWER_LAYERS}
        self._saved = {name: SecondsLedger() for name in (*ANSWER_LAYERS, "prefix")}
        self._totals = Totals()
        self._skipped: Counter[str] = Counter()
        self._windows: dict[int, Counter[str]] = {}

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
        store = CompactMemoryStore(max_bytes=self.setup.exact_capacity_bytes, clock=self._clock)
        self._cache = Cache(settings, backend=store, clock=self._clock, metrics=self.metrics)
        if self._semantic is not None:
            s = self._semantic
            self._cache.enable_semantic(
                s.embedder, config=s.config, guards=s.guards, index_factory=s.index_factory
            )

    def observe(self, event: PreparedRequest, census_reused: int = 0) -> None:
        """Replay one request; `census_reused`: what the census's unbounded tree reused of it."""
        if self._clock is None:
            self._start(event)
        assert self._clock is not None
        if event.timestamp_s is not None:
            self._clock.set_now(event.timestamp_s)
        window = self._window(event)
        prompt = event.prompt_tokens or 0
        completion = event.completion_tokens or 0
        self._count_totals(event, prompt, completion)
        if window is not None:
            window["requests"] += 1
        if self._cache is None or event.body is None:
            if self._cache is not None:
                self._skipped[f"no request body ({event.kind})"] += 1
            self._upstream(event, prompt, census_reused, window)
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
            self._serve(event, outcome, prompt, completion, window)
            return
        self._upstream(event, prompt, census_reused, window)
        response = self._response(event, prompt, completion)
        close_fetched(outcome, response, event.upstream_s or 0.0)  # the miss protocol's close

    def _window(self, event: PreparedRequest) -> Counter[str] | None:
        if self._window_s is None or event.timestamp_s is None:
            return None
        return self._windows.setdefault(int(event.timestamp_s // self._window_s), Counter())

    def _count_totals(self, event: PreparedRequest, prompt: int, completion: int) -> None:
        t = self._totals
        t.requests += 1
        t.prompt_tokens += prompt
        t.completion_tokens += completion
        t.completion_unknown += event.completion_tokens is None
        t.seconds.add_call(event.model, event.upstream_s, prompt, completion)
        t.cost_usd += self._prices.cost_usd(event.model, prompt, completion)

    def _serve(
        self,
        event: PreparedRequest,
        done: Completion,
        prompt: int,
        completion: int,
        window: Counter[str] | None,
    ) -> None:
        layer = done.layer.value
        self._served[layer] += 1
        if window is not None:
            window[layer] += 1
        if done.layer in (Layer.EXACT, Layer.SEMANTIC):
            measured = done.response.get(MEASURED_S_KEY)
            usage = done.response.get("usage") or {}
            served = usage.get("completion_tokens")
            self._saved[layer].add_call(
                event.model,
                float(measured) if isinstance(measured, int | float) else None,
                prompt,
                served if isinstance(served, int) else completion,
            )
            if done.age_s is not None:
                self._ages[layer].add(done.age_s)
                self._max_age_s[layer] = max(self._max_age_s[layer], done.age_s)

    def _upstream(
        self,
        event: PreparedRequest,
        prompt: int,
        census_reused: int,
        window: Counter[str] | None,
    ) -> None:
        """The request reaches the engine: account its prefix reuse."""
        if self.setup.prefix is None or event.units is None or not prompt:
            return
        reused = census_reused if self._tree is None else self._tree_reuse(event, prompt)
        metrics = self.metrics.strategy("prefix")
        metrics.prompt_tokens(prompt)
        if window is not None:
            window["prefix_seen"] += prompt
            window["prefix_reused"] += reused
        if reused > 0:
            self._saved["prefix"].add_prefill(event.model, reused)
            metrics.hit(
                prompt_tokens=reused,
                completion_tokens=0,
                upstream_s=0.0,  # priced from the ledger once the rates are known
                money_usd=self._prices.prefix_savings_usd(event.model, reused),
            )
        else:
            metrics.miss(MissReason.ABSENT)

    def _tree_reuse(self, event: PreparedRequest, prompt: int) -> int:
        assert self._tree is not None
        assert self._clock is not None
        assert event.units is not None
        return self._tree.observe(
            logged_namespace(
                event.tenant, event.model, event.body, share_across_tenants=self._share
            ),
            event.units,
            unit_tokens=event.unit_tokens,
            prompt_tokens=prompt,
            now_s=self._clock.now_s(),
        ).reused_tokens

    @staticmethod
    def _response(event: PreparedRequest, prompt: int, completion: int) -> dict[str, Any]:
        """The answer the replayed cache stores. Its usage counts the prompt as the analysis
        does (`prompt`: the tokenizer's count, or the trace's), so what a hit saves and the
        totals it is a share of are counted alike: a provider's logged count beside our
        tokenizer's put a saved share over 100%."""
        if event.response is None:
            out = synthetic_response(event.model, prompt, completion)
        else:
            usage = {"prompt_tokens": prompt, "completion_tokens": completion}
            out = {**event.response, "usage": {**usage, "total_tokens": prompt + completion}}
        if event.upstream_s is not None:
            out[MEASURED_S_KEY] = event.upstream_s
        return out

    def result(self) -> ReplayResult:
        if self._tree is not None:
            stats = self._tree.stats()
            prefix = self.metrics.strategy("prefix")
            prefix.gauge("kv_tokens", stats.cached_tokens)
            prefix.gauge("evicted_tokens", stats.evicted_tokens)
        return ReplayResult(
            self.setup,
            self.metrics.snapshot()["strategies"],
            self._saved,
            self._served,
            self._ages,
            self._max_age_s,
            self._totals,
            self._skipped,
            self._windows,
        )

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
