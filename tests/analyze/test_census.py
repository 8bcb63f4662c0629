"""Acceptance 1 (the census part): on generated logs with known truth, exact shares match
exactly and the prefix token share is within 1 point of the truth. Two truths for the prefix
share: an independent exact count (each prompt against its lexicographic neighbours among the
earlier prompts, which is where its longest common prefix with any of them is found), and
the generator's structure (shared system prompt, repeats, each turn extending the last)."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.census import Class, RecentIdentities
from infercache.analyze.tokenizing.tokenizers import Chars4Tokenizer, PromptTokenizer
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import (
    Generated,
    drafting_tool,
    multi_turn_chat,
    support_bot,
    timestamped_support,
)


def lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def independent_prefix_share(
    records: list[dict[str, Any]], tokenizer: PromptTokenizer
) -> tuple[float, dict[str, float]]:
    """Σ min(longest common prefix with an earlier prompt of the tenant, len - 1) / Σ len,
    overall and per tenant, by sorted insertion (no radix tree)."""
    earlier: dict[str, list[tuple[int, ...]]] = {}
    reused: dict[str, int] = {}
    total: dict[str, int] = {}
    for r in records:
        tenant = r["tenant"]
        ids = tokenizer.encode_messages(r["request"]["messages"])
        seen = earlier.setdefault(tenant, [])
        at = bisect.bisect_left(seen, ids)
        best = max((lcp(ids, seen[j]) for j in (at - 1, at) if 0 <= j < len(seen)), default=0)
        reused[tenant] = reused.get(tenant, 0) + min(best, len(ids) - 1)
        total[tenant] = total.get(tenant, 0) + len(ids)
        seen.insert(at, ids)
    share = sum(reused.values()) / sum(total.values())
    return share, {t: reused[t] / total[t] for t in total}


def structural_prefix_share(gen: Generated, tokenizer: PromptTokenizer) -> float:
    """What the generator built: repeats reuse their whole prompt, a turn reuses the turn it
    extends, anything else reuses the head it shares with its tenant's earlier prompts (the
    template up to the last message's text)."""
    ids = [tokenizer.encode_messages(r["request"]["messages"]) for r in gen.records]
    heads: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    reused = 0
    for i, (r, repeat, previous) in enumerate(
        zip(gen.records, gen.truth.exact_repeat, gen.truth.previous_turn, strict=True)
    ):
        tenant = r["tenant"]
        if repeat:
            reused += len(ids[i]) - 1
        elif previous is not None:
            reused += len(ids[previous])
        elif tenant in first_seen:
            if tenant not in heads:
                head = [*r["request"]["messages"][:-1], {"role": "user", "content": "\x00"}]
                other = [*head[:-1], {"role": "user", "content": "\x01"}]
                heads[tenant] = lcp(
                    tokenizer.encode_messages(head), tokenizer.encode_messages(other)
                )
            reused += heads[tenant]
        first_seen.setdefault(tenant, i)
    return reused / sum(len(x) for x in ids)


def analyse(gen: Generated, tmp_path: Path, run_analysis: RunAnalysis, **kw: Any) -> Any:
    return run_analysis([gen.write(tmp_path / "log.jsonl")], replay=False, **kw)


def test_support_bot_census_matches_the_truth(tmp_path: Path, run_analysis: RunAnalysis) -> None:
    gen = support_bot(seed=11, n=1500)
    total = analyse(gen, tmp_path, run_analysis).census.total
    repeats = sum(gen.truth.exact_repeat)
    assert total.requests == 1500
    assert total.classes[Class.EXACT_REPEAT] == repeats
    # Without near-duplicates every other request shares the ~470-token system prompt
    # (>= 256 tokens) with the one before it; only the very first is unique.
    assert total.classes[Class.SHARED_PREFIX] == 1500 - repeats - 1
    assert total.classes[Class.UNIQUE] == 1
    share = total.reused_tokens / total.prompt_tokens
    tokenizer = Chars4Tokenizer()
    assert share == pytest.approx(independent_prefix_share(gen.records, tokenizer)[0], abs=1e-12)
    assert share == pytest.approx(structural_prefix_share(gen, tokenizer), abs=0.01)


def test_drafting_tool_census_has_no_repeats_and_shares_only_the_style_guide(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    gen = drafting_tool(seed=5, n=600)
    census = analyse(gen, tmp_path, run_analysis).census
    assert census.total.classes[Class.EXACT_REPEAT] == 0
    tokenizer = Chars4Tokenizer()
    share, by_tenant = independent_prefix_share(gen.records, tokenizer)
    assert census.total.reused_tokens / census.total.prompt_tokens == pytest.approx(share)
    assert share == pytest.approx(structural_prefix_share(gen, tokenizer), abs=0.01)
    docs, notes = census.by_tenant["docs"], census.by_tenant["notes"]
    assert docs.reused_tokens / docs.prompt_tokens == pytest.approx(by_tenant["docs"])
    assert docs.reused_tokens / docs.prompt_tokens > 0.5
    assert notes.reused_tokens / notes.prompt_tokens < 0.05
    # `notes` requests share nothing long: unique; `docs` ones share the style guide.
    assert notes.classes[Class.UNIQUE] == notes.requests
    assert docs.classes[Class.SHARED_PREFIX] == docs.requests - 1
    half = sum(1 for r in gen.records if r["request"].get("temperature") == 0.7)
    assert census.not_cacheable["sampled without a seed"] == half


def test_multi_turn_chat_census_matches_the_truth(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    gen = multi_turn_chat(seed=2, conversations=60)
    census = analyse(gen, tmp_path, run_analysis).census
    assert census.total.classes[Class.EXACT_REPEAT] == sum(gen.truth.exact_repeat) > 0
    tokenizer = Chars4Tokenizer()
    share = census.total.reused_tokens / census.total.prompt_tokens
    assert share == pytest.approx(independent_prefix_share(gen.records, tokenizer)[0])
    assert share == pytest.approx(structural_prefix_share(gen, tokenizer), abs=0.01)
    # A turn is `shared_prefix` exactly when the turn it extends is at least 256 tokens long.
    ids = [tokenizer.encode_messages(r["request"]["messages"]) for r in gen.records]
    long_enough = sum(
        1
        for prev, repeat in zip(gen.truth.previous_turn, gen.truth.exact_repeat, strict=True)
        if not repeat and prev is not None and len(ids[prev]) >= 256
    )
    assert census.total.classes[Class.SHARED_PREFIX] == long_enough


def test_reuse_distances_of_exact_repeats_are_measured_from_the_last_occurrence(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "same"}], "temperature": 0}
    records = [{"timestamp": t, "request": body} for t in (0.0, 5.0, 7.0, 4000.0)]
    gen = Generated(records, truth=support_bot(n=0).truth)
    census = analyse(gen, tmp_path, run_analysis, ttl_s=60).census
    bins = census.distances[Class.EXACT_REPEAT]
    assert sum(bins.counts) == 3
    assert census.within_ttl[Class.EXACT_REPEAT] == 2  # 5 s and 2 s; not 3993 s
    assert bins.counts[bins.bounds.index(5.623)] == 1  # 5 s lands in (3.162, 5.623]


@pytest.mark.slow
def test_support_bot_prefix_share_with_the_packaged_tokenizer(
    tmp_path: Path, run_analysis: RunAnalysis, smollm2: PromptTokenizer
) -> None:
    gen = support_bot(seed=4, n=400)
    total = analyse(gen, tmp_path, run_analysis, tokenizer=smollm2).census.total
    assert total.classes[Class.EXACT_REPEAT] == sum(gen.truth.exact_repeat)
    share = total.reused_tokens / total.prompt_tokens
    assert share == pytest.approx(independent_prefix_share(gen.records, smollm2)[0])
    assert share == pytest.approx(structural_prefix_share(gen, smollm2), abs=0.01)


def test_recent_identities_stay_bounded_and_say_when_they_forgot() -> None:
    recent = RecentIdentities(max_identities=4)  # keeps the last 2 to 4 identities seen
    assert recent.see(b"a", 1.0) == (False, None)
    assert recent.see(b"b", 2.0) == (False, None)
    assert recent.see(b"a", 3.0) == (True, 1.0)  # a was used again: it moves to the new half
    forgot_before = recent.forgot
    assert recent.see(b"c", 4.0) == (False, None)  # the new half is full: b is dropped
    assert (forgot_before, recent.forgot) == (False, True)
    assert recent.see(b"b", 5.0) == (False, None)
    assert recent.see(b"a", 6.0) == (True, 3.0)


def test_reading_in_a_child_process_gives_the_same_analysis(tmp_path: Path, settings: Any) -> None:
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions

    log = timestamped_support(seed=3, n=300).write(tmp_path / "a.jsonl")
    chat = multi_turn_chat(seed=3, conversations=20).write(tmp_path / "b.jsonl", gz=True)
    results = []
    for parallel in (False, True):
        analyzer = Analyzer(
            AnalyzeOptions(window=64),
            settings=settings,
            tokenizer=Chars4Tokenizer,  # a class: picklable for the child process
            parallel=parallel,
        )
        results.append(analyzer.run([log, chat]))
    alone, child = results
    assert child.census.total == alone.census.total
    assert child.census.by_tenant == alone.census.by_tenant
    assert [b.tokens_lost for b in child.breakers] == [b.tokens_lost for b in alone.breakers]
    assert child.replays["layered"].strategies == alone.replays["layered"].strategies
    assert (child.lines, child.kinds, child.tokenizer) == (alone.lines, alone.kinds, "chars4")


def test_a_child_process_error_is_raised_here(tmp_path: Path, settings: Any) -> None:
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions
    from infercache.errors import ConfigError

    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    analyzer = Analyzer(
        AnalyzeOptions(), settings=settings, tokenizer=Chars4Tokenizer, parallel=True
    )
    with pytest.raises(ConfigError, match="is empty"):
        analyzer.run([empty])


def test_freezing_the_gc_during_a_pass_is_undone_after_it(tmp_path: Path, settings: Any) -> None:
    import gc

    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions

    log = support_bot(seed=1, n=3000).write(tmp_path / "log.jsonl")
    frozen: list[int] = []  # progress is reported every 1024 lines: look at the GC then
    analyzer = Analyzer(
        AnalyzeOptions(window=50, reorder_window=10),
        settings=settings,
        tokenizer=Chars4Tokenizer,
        replay=False,
        freeze_gc=True,
    )
    analysis = analyzer.run([log], progress=lambda _: frozen.append(gc.get_freeze_count()))
    assert analysis.census.total.requests == 3000
    assert max(frozen) > 0  # frozen while the pass ran...
    assert gc.get_freeze_count() == 0  # ...and thawed after it
