"""One streaming pass over the logs: read, prepare, check a window for near-duplicates, then census
and replays, request by request in time order.

    LogReader (log_reader.py) ─records─▶ RequestPreparer (prepared_request.py)
        ─requests─▶ a window of requests:
        1. Census.remember(request): exact repeat or not                       (census.py)
        2. NearDuplicateFinder.check(window): one embedding batch      (near_duplicates/finder.py)
        3. each request: Census.observe(request, repeat, near)  (census.py, prefix_breakers.py)
                         RateFit.add(its timing)                             (cost_model.py)
                         Replay.observe(request, census reuse) for each replay (replay.py)
    then: CostModel.decide(fit) prices every ledger of seconds.
The reader also sums each line's provider prompt-cache usage (provider_prompt_cache.py).
With `parallel`, reading and preparing run in a child process (reader_process.py). Memory is a
few windows of requests plus each consumer's bounded state; the file is never held.

Near-duplicates (`options.semantic`): with a candidate filter (the packaged public calibration)
a uniform sample of the requests is checked, sized from the log's estimated length for a 95%
interval of ± `half_width` (infercache/intervals.py), and windows grow so each holds ~64
sampled requests (one matcher batch); without one every request is embedded and the semantic
layer is replayed.

Replays (`replay=True`): `layered` (exact → semantic when replayed → prefix, the TTL and
capacities given) and `prefix` (KV reuse alone). Both read the census's prefix reuse when the
KV budget is unbounded (replay.py says why that is exact). With `options.sweep`, also the cache
at each TTL of `ttl_grid_s` (`ttl:<s>`) and the exact store at each capacity factor
(`exact_capacity:<f>`): the hit-rate curves. The KV budget curve comes from the census
(kv_sweep.py). Raises ConfigError when no line of any log can be used.
"""

from __future__ import annotations

import contextlib
import gc
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infercache.analyze.census import NOT_CHECKED, Census, CensusResult
from infercache.analyze.cost_model import CostModel, RateFit
from infercache.analyze.log_reader import LineErrors, Progress, estimate_lines
from infercache.analyze.near_duplicates.finder import (
    CandidateStage,
    NearDuplicateFinder,
    PrimedEmbedder,
)
from infercache.analyze.near_duplicates.scoped_texts import small_flat_index
from infercache.analyze.options import AnalyzeOptions, SemanticOptions
from infercache.analyze.prepared_request import PreparedRequest
from infercache.analyze.provider_prompt_cache import ProviderPromptCaches
from infercache.analyze.reader_process import ChildEvents, SourceSpec, produce
from infercache.analyze.replay import CENSUS, TREE, Replay, ReplayResult, ReplaySetup, SemanticParts
from infercache.clock import Clock, SystemClock
from infercache.errors import ConfigError
from infercache.intervals import sample_size
from infercache.metrics import PriceTable
from infercache.prefix_breakers import Breaker, BreakerFinder
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard, build_guards, default_guards
from infercache.semantic.index import IndexFactory
from infercache.semantic.layer import SemanticConfig
from infercache.settings import Settings
from infercache.tokenizing.tokenizers import PromptTokenizer

SAMPLED_PER_WINDOW = 64  # sampled requests per matcher batch
MAX_WINDOW = 16_384
READER_BATCH = 1024  # requests a message from the reader process: a bounded queue
MATCHER_VECTORS_KEPT = 50_000  # sampled mode: matcher vectors remembered across windows


@dataclass(frozen=True, slots=True)
class SemanticRun:
    threshold: float
    source: str
    label: str | None  # "public calibration — ..." for the packaged one
    embedder: str  # the matcher's name (model, version, settings)
    guards: tuple[str, ...]
    sample_rate: float  # share of requests checked (1: all)
    candidate_embedder: str | None  # the fast embedder in front, when sampling
    min_word_jaccard: float | None
    texts_embedded: int  # by the matcher
    chars_embedded: int
    candidate_texts_embedded: int
    embed_s: float  # seconds spent embedding (matcher and candidates)
    replayed: bool  # whether the semantic layer was replayed


@dataclass
class Analysis:
    files: list[str]
    options: AnalyzeOptions
    tokenizer: str | None  # None: no text log needed one
    census: CensusResult
    breakers: list[Breaker]
    replays: dict[str, ReplayResult]
    cost: CostModel
    errors: LineErrors
    lines: int
    kinds: Counter[str]
    semantic: SemanticRun | None
    hashed_by: Counter[str]  # redacted logs: the tokenizers behind their prefix hashes
    prices: PriceTable
    prompt_caches: ProviderPromptCaches  # the provider's own, as the log recorded it
    wall_s: float
    notes: list[str] = field(default_factory=list)


def replay_setups(options: AnalyzeOptions, *, semantic: bool) -> list[ReplaySetup]:
    exact, budget, ttl = options.exact_capacity_bytes, options.prefix_capacity_tokens, options.ttl_s
    alone = CENSUS if budget is None else TREE
    under = CENSUS if budget is None and not semantic else TREE
    setups = [
        ReplaySetup("layered", ttl, exact, under, budget, semantic),
        ReplaySetup("prefix", ttl, None, alone, budget),
    ]
    if options.sweep:
        setups += [
            ReplaySetup(f"ttl:{t:g}", t, exact, None, None, semantic) for t in options.ttl_grid_s
        ]
        for f in options.capacity_factors:
            setups.append(ReplaySetup(f"exact_capacity:{f:g}", ttl, max(1, int(exact * f)), None))
    return setups


def guards_of(specs: tuple[str, ...] | None) -> list[Guard]:
    return default_guards() if specs is None else build_guards(specs)


class Analyzer:
    """Wires the pass; `run(paths)` does it. `embedder` (the matcher) is required when
    `options.semantic` is set, and `candidate_embedder` too when it samples; `parallel` reads
    and prepares in a child process (reader_process.py; the tokenizer factory must then be
    picklable); `freeze_gc` keeps the cyclic GC off the census's long-lived state (process-wide
    while the pass runs); `clock` only times the pass and the embedding; `rng` draws the
    near-duplicate sample (seeded from `options.seed` by default)."""

    def __init__(
        self,
        options: AnalyzeOptions,
        *,
        settings: Settings,
        tokenizer: Callable[[], PromptTokenizer],
        embedder: Embedder | None = None,
        candidate_embedder: Embedder | None = None,
        index_factory: IndexFactory | None = None,
        replay: bool = True,
        parallel: bool = False,
        freeze_gc: bool = False,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        s = options.semantic
        if s is not None and embedder is None:
            raise ConfigError("measuring near-duplicates needs an embedder")
        if s is not None and s.sampled and candidate_embedder is None:
            raise ConfigError("sampling near-duplicates needs a candidate embedder")
        self.options = options
        self.settings = settings
        self._tokenizer = tokenizer
        self._embedder = embedder
        self._candidate_embedder = candidate_embedder
        self._index_factory = index_factory or small_flat_index
        self._replay = replay
        self._parallel = parallel
        self._freeze_gc = freeze_gc
        self._counter: PromptTokenizer | None = None
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random(options.seed)

    def run(self, paths: Sequence[Path], *, progress: Progress | None = None) -> Analysis:
        started = self._clock.monotonic_s()
        if not paths:
            raise ConfigError("no log file given")
        finder = self._finder(paths)
        census, breakers = self._census(finder is not None)
        replays = self._replays(finder)
        fit = RateFit()
        hashed_by: Counter[str] = Counter()
        window = self._window(finder)

        pending: list[PreparedRequest] = []  # batches arrive smaller than a window

        def consume(batch: list[PreparedRequest]) -> None:
            pending.extend(batch)
            hashed_by.update(e.hashed_by for e in batch if e.hashed_by is not None)
            while len(pending) >= window:
                self._flush(pending[:window], census, finder, fit, replays)
                del pending[:window]
                freeze()

        with _long_lived_state_frozen(self._freeze_gc) as freeze:
            spec = self._spec(paths, window)
            if self._parallel:
                events = ChildEvents(spec, self._own_tokenizer, progress=progress)
                for batch in events:
                    consume(batch)
                summary = events.summary
            else:
                summary = produce(spec, consume, progress)
            self._flush(pending, census, finder, fit, replays)
        result = census.result()
        if result.total.requests == 0:
            raise ConfigError(_nothing_read(paths, summary.errors))
        for r in replays:
            r.close()
        return Analysis(
            files=[str(p) for p in paths],
            options=self.options,
            tokenizer=self._counter.name if self._counter is not None else None,
            census=result,
            breakers=breakers.findings(),
            replays={r.setup.name: r.result() for r in replays},
            cost=CostModel.decide(fit, result.by_model, self.options.upstream),
            errors=summary.errors,
            lines=summary.lines,
            kinds=summary.kinds,
            semantic=self._semantic_run(finder),
            hashed_by=hashed_by,
            prices=self.settings.prices,
            prompt_caches=summary.prompt_caches,
            wall_s=self._clock.monotonic_s() - started,
        )

    def _spec(self, paths: Sequence[Path], window: int) -> SourceSpec:
        o = self.options
        return SourceSpec(
            paths=tuple(paths),
            # the child gets the (picklable) factory; in this process one tokenizer serves all
            tokenizer=self._tokenizer if self._parallel else self._own_tokenizer,
            policy=self.settings.policy(),
            ignorable_fields=self.settings.ignorable_fields,
            block_tokens=o.block_tokens,
            with_queries=o.semantic is not None,
            keep_bodies=self._replay,
            reorder_window=o.reorder_window,
            batch=min(window, READER_BATCH),
            prices=self.settings.prices,
        )

    def _own_tokenizer(self) -> PromptTokenizer:
        """This process's tokenizer, built on first use (never, for a block trace): for every
        prompt and for prefix-breaker counts."""
        if self._counter is None:
            self._counter = self._tokenizer()
        return self._counter

    def _count_tokens(self, text: str) -> int:
        return self._own_tokenizer().count(text)

    def _census(self, near_measured: bool) -> tuple[Census, BreakerFinder]:
        breakers = BreakerFinder(self._count_tokens)
        return Census(self.options, breakers=breakers, near_measured=near_measured), breakers

    def _finder(self, paths: Sequence[Path]) -> NearDuplicateFinder | None:
        s = self.options.semantic
        if s is None or self._embedder is None:
            return None
        common = {
            "threshold": s.threshold,
            "guards": guards_of(s.guards),
            "k": s.k,
            "max_vectors": s.max_vectors,
            "index_factory": self._index_factory,
            "clock": self._clock,
        }
        if s.candidates is None or self._candidate_embedder is None:
            return NearDuplicateFinder(PrimedEmbedder(self._embedder), **common)  # type: ignore[arg-type]
        stage = CandidateStage(
            PrimedEmbedder(self._candidate_embedder), s.candidates.k, s.candidates.min_word_jaccard
        )
        return NearDuplicateFinder(
            PrimedEmbedder(self._embedder, keep=MATCHER_VECTORS_KEPT),
            candidates=stage,
            sample_rate=sample_rate(s, estimate_lines(paths)),
            rng=self._rng,
            **common,  # type: ignore[arg-type]
        )

    def _window(self, finder: NearDuplicateFinder | None) -> int:
        base = self.options.window
        if finder is None or finder.sample_rate >= 1:
            return base
        return min(MAX_WINDOW, max(base, math.ceil(SAMPLED_PER_WINDOW / finder.sample_rate)))

    def _replays(self, finder: NearDuplicateFinder | None) -> list[Replay]:
        if not self._replay:
            return []
        s = self.options.semantic
        parts = None
        if s is not None and finder is not None and finder.candidates is None:
            parts = SemanticParts(
                finder.matcher,
                SemanticConfig(threshold=s.threshold, k=s.k, max_vectors=s.max_vectors),
                tuple(guards_of(s.guards)),
                self._index_factory,
            )
        return [
            Replay(
                setup,
                settings=self.settings,
                share_prefix_across_tenants=self.options.share_prefix_across_tenants,
                window_s=self.options.window_s,
                semantic=parts,
            )
            for setup in replay_setups(self.options, semantic=parts is not None)
        ]

    def _flush(
        self,
        window: list[PreparedRequest],
        census: Census,
        finder: NearDuplicateFinder | None,
        fit: RateFit,
        replays: Iterable[Replay],
    ) -> None:
        repeats = [census.remember(e) for e in window]
        if finder is not None:
            checks = finder.check(window, [r.seen for r in repeats])
        else:
            checks = [NOT_CHECKED] * len(window)
        for event, repeat, near in zip(window, repeats, checks, strict=True):
            seen = census.observe(event, repeat=repeat, near=near)
            if event.timing is not None:
                fit.add(event.model, event.timing)
            for replay in replays:
                replay.observe(event, seen.reused_tokens)

    def _semantic_run(self, finder: NearDuplicateFinder | None) -> SemanticRun | None:
        s = self.options.semantic
        if s is None or finder is None:
            return None
        stage = finder.candidates
        return SemanticRun(
            threshold=s.threshold,
            source=s.source,
            label=s.label,
            embedder=finder.matcher.name,
            guards=tuple(g.name for g in guards_of(s.guards)),
            sample_rate=finder.sample_rate,
            candidate_embedder=stage.embedder.name if stage is not None else None,
            min_word_jaccard=stage.min_word_jaccard if stage is not None else None,
            texts_embedded=finder.matcher.embedded,
            chars_embedded=finder.matcher.embedded_chars,
            candidate_texts_embedded=stage.embedder.embedded if stage is not None else 0,
            embed_s=finder.embed_s,
            replayed=stage is None and self._replay,
        )


def sample_rate(options: SemanticOptions, estimated_requests: int) -> float:
    """The share of requests to check for ~± `half_width` at 95% (1 for small logs)."""
    wanted = sample_size(options.half_width)
    return 1.0 if estimated_requests <= wanted else wanted / estimated_requests


@contextlib.contextmanager
def _long_lived_state_frozen(enabled: bool) -> Iterator[Callable[[], None]]:
    """The census keeps millions of long-lived objects (radix nodes, identities). Left to the
    cyclic GC, every full collection walks them all, more of them as the pass goes on. So
    (when `enabled`: it touches the whole process, the CLI turns it on) what survives each
    window is frozen (`gc.freeze`: collections skip it) and thawed when the pass ends;
    reference counting still frees every acyclic object as usual."""
    if not enabled:
        yield lambda: None
        return
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()


def _nothing_read(paths: Sequence[Path], errors: LineErrors) -> str:
    names = ", ".join(str(p) for p in paths)
    shown = "; ".join(f"{src}:{line}: {why}" for src, line, why in errors.kept[:5])
    return (
        f"no request could be read from {names} ({errors.count} malformed line(s)"
        + (f": {shown}" if shown else "")
        + ")"
    )
