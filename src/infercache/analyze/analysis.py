"""One streaming pass over the logs: read, prepare, embed a window, then census and replays.

    LogReader (log_reader.py) ─records─▶ RequestPreparer (prepared_request.py)
        ─requests─▶ a window of `window` requests
        near-duplicates on: PrimedEmbedder.prime(the window's texts), one batch
        each request, in time order: Census.observe(request, vector)
                                     (census.py, prefix_breakers.py)
                                   Replay.observe(event) for every replay  (replay.py)
With `parallel`, reading and preparing run in a child process (reader_process.py). Memory is a few
windows of events plus each consumer's bounded state; the file is never held.

Replays (`replay=True`): `layered` (exact → semantic when configured → prefix, the TTL and
capacities given) and `prefix` (KV reuse alone). With `options.sweep`, also the cache at each
TTL of `ttl_grid_s` (`ttl:<s>`), the exact store at each capacity factor (`exact_capacity:<f>`)
and the prefix cache at each factor (`prefix_capacity:<f>`): the hit-rate curves.
Raises ConfigError when no line of any log can be used.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infercache.analyze.census import Census, CensusResult
from infercache.analyze.log_reader import LineErrors, Progress
from infercache.analyze.near_duplicates import NearDuplicates, PrimedEmbedder, small_flat_index
from infercache.analyze.options import AnalyzeOptions
from infercache.analyze.prefix_breakers import Breaker, BreakerFinder
from infercache.analyze.prepared_request import PreparedRequest
from infercache.analyze.reader_process import ChildEvents, SourceSpec, produce
from infercache.analyze.replay import Replay, ReplayResult, ReplaySetup, SemanticParts
from infercache.analyze.tokenizing.tokenizers import PromptTokenizer
from infercache.clock import Clock, SystemClock
from infercache.errors import ConfigError
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard, build_guards, default_guards
from infercache.semantic.index import IndexFactory
from infercache.semantic.layer import SemanticConfig
from infercache.settings import Settings


@dataclass(frozen=True, slots=True)
class SemanticRun:
    threshold: float
    source: str
    embedder: str  # the embedder's name (model, version, settings)
    guards: tuple[str, ...]
    texts_embedded: int
    chars_embedded: int
    embed_s: float  # seconds spent embedding


@dataclass
class Analysis:
    files: list[str]
    options: AnalyzeOptions
    tokenizer: str | None  # None: no text log needed one
    census: CensusResult
    breakers: list[Breaker]
    replays: dict[str, ReplayResult]
    errors: LineErrors
    lines: int
    kinds: Counter[str]
    semantic: SemanticRun | None
    wall_s: float
    notes: list[str] = field(default_factory=list)


def replay_setups(options: AnalyzeOptions) -> list[ReplaySetup]:
    semantic = options.semantic is not None
    exact, prefix, ttl = options.exact_capacity_bytes, options.prefix_capacity_tokens, options.ttl_s
    setups = [
        ReplaySetup("layered", ttl, exact, prefix, semantic),
        ReplaySetup("prefix", ttl, None, prefix),
    ]
    if options.sweep:
        setups += [ReplaySetup(f"ttl:{t:g}", t, exact, None, semantic) for t in options.ttl_grid_s]
        for f in options.capacity_factors:
            setups.append(ReplaySetup(f"exact_capacity:{f:g}", ttl, max(1, int(exact * f)), None))
            setups.append(ReplaySetup(f"prefix_capacity:{f:g}", ttl, None, max(1, int(prefix * f))))
    return setups


def guards_of(specs: tuple[str, ...] | None) -> list[Guard]:
    return default_guards() if specs is None else build_guards(specs)


class Analyzer:
    """Wires the pass; `run(paths)` does it. `embedder` is required when `options.semantic`
    is set; `parallel` reads and prepares in a child process (reader_process.py; the tokenizer
    factory must then be picklable); `freeze_gc` keeps the cyclic GC off the census's
    long-lived state (process-wide while the pass runs); `clock` only times the pass and the
    embedding."""

    def __init__(
        self,
        options: AnalyzeOptions,
        *,
        settings: Settings,
        tokenizer: Callable[[], PromptTokenizer],
        embedder: Embedder | None = None,
        index_factory: IndexFactory | None = None,
        replay: bool = True,
        parallel: bool = False,
        freeze_gc: bool = False,
        clock: Clock | None = None,
    ) -> None:
        if options.semantic is not None and embedder is None:
            raise ConfigError("measuring near-duplicates needs an embedder")
        self.options = options
        self.settings = settings
        self._tokenizer = tokenizer
        self._primed = PrimedEmbedder(embedder) if embedder is not None else None
        self._index_factory = index_factory or small_flat_index
        self._replay = replay
        self._parallel = parallel
        self._freeze_gc = freeze_gc
        self._counter: PromptTokenizer | None = None
        self._clock = clock or SystemClock()
        self._embed_s = 0.0

    def run(self, paths: Sequence[Path], *, progress: Progress | None = None) -> Analysis:
        started = self._clock.monotonic_s()
        if not paths:
            raise ConfigError("no log file given")
        census, breakers = self._census()
        replays = self._replays()
        spec = self._spec(paths)

        def consume(batch: list[PreparedRequest]) -> None:
            self._flush(batch, census, replays)
            freeze()

        with _long_lived_state_frozen(self._freeze_gc) as freeze:
            if self._parallel:
                events = ChildEvents(spec, self._own_tokenizer, progress=progress)
                for batch in events:
                    consume(batch)
                summary = events.summary
            else:
                summary = produce(spec, consume, progress)
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
            errors=summary.errors,
            lines=summary.lines,
            kinds=summary.kinds,
            semantic=self._semantic_run(),
            wall_s=self._clock.monotonic_s() - started,
        )

    def _spec(self, paths: Sequence[Path]) -> SourceSpec:
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
            batch=o.window,
        )

    def _own_tokenizer(self) -> PromptTokenizer:
        """This process's tokenizer, built on first use (never, for a block trace): for every
        prompt and for prefix-breaker counts."""
        if self._counter is None:
            self._counter = self._tokenizer()
        return self._counter

    def _count_tokens(self, text: str) -> int:
        return self._own_tokenizer().count(text)

    def _census(self) -> tuple[Census, BreakerFinder]:
        s = self.options.semantic
        near = None
        if s is not None:
            near = NearDuplicates(
                threshold=s.threshold,
                guards=guards_of(s.guards),
                k=s.k,
                max_vectors=s.max_vectors,
                index_factory=self._index_factory,
            )
        breakers = BreakerFinder(self._count_tokens)
        return Census(self.options, near=near, breakers=breakers), breakers

    def _replays(self) -> list[Replay]:
        if not self._replay:
            return []
        s = self.options.semantic
        parts = None
        if s is not None and self._primed is not None:
            parts = SemanticParts(
                self._primed,
                SemanticConfig(threshold=s.threshold, k=s.k, max_vectors=s.max_vectors),
                tuple(guards_of(s.guards)),
                self._index_factory,
            )
        return [
            Replay(setup, settings=self.settings, options=self.options, semantic=parts)
            for setup in replay_setups(self.options)
        ]

    def _flush(
        self, window: list[PreparedRequest], census: Census, replays: Iterable[Replay]
    ) -> None:
        primed = self._primed if self.options.semantic is not None else None
        if primed is not None:
            started = self._clock.monotonic_s()
            primed.prime(e.query.text for e in window if e.query is not None)
            self._embed_s += self._clock.monotonic_s() - started
        for event in window:
            vector = None
            if primed is not None and event.query is not None:
                vector = primed.vector(event.query.text)
            census.observe(event, vector)
            for replay in replays:
                replay.observe(event)

    def _semantic_run(self) -> SemanticRun | None:
        s = self.options.semantic
        if s is None or self._primed is None:
            return None
        guards = tuple(g.name for g in guards_of(s.guards))
        primed = self._primed
        return SemanticRun(
            s.threshold,
            s.source,
            primed.name,
            guards,
            primed.embedded,
            primed.embedded_chars,
            self._embed_s,
        )


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
