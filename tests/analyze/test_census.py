"""Acceptance 1 (the census part): on generated logs with known truth, exact shares match
exactly and the prefix token share is within 1 point of the truth. Two truths for the prefix
share: an independent exact count (each prompt against its lexicographic neighbours among the
earlier prompts, which is where its longest common prefix with any of them is found), and
the generator's structure (shared system prompt, repeats, each turn extending the last).
The `shared_prefix` class is checked request by request against the independent count: not a
repeat, and reusing at least half of its prompt."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.census import Class, RecentIdentities, Tally
from infercache.tokenizing.tokenizers import Chars4Tokenizer, PromptTokenizer
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import (
    Generated,
    drafting_tool,
    multi_turn_chat,
    short_support_bot,
    support_bot,
    timestamped_support,
)


def lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def independent_reuse(
    records: list[dict[str, Any]], tokenizer: PromptTokenizer
) -> list[tuple[str, int, int]]:
    """Per request (tenant, reused tokens, prompt tokens): min(longest common prefix with an
    earlier prompt of the tenant, len - 1), by sorted insertion (no radix tree)."""
    earlier: dict[str, list[tuple[int, ...]]] = {}
    out = []
    for r in records:
        tenant = r["tenant"]
        ids = tokenizer.encode_messages(r["request"]["messages"])
        seen = earlier.setdefault(tenant, [])
        at = bisect.bisect_left(seen, ids)
        best = max((lcp(ids, seen[j]) for j in (at - 1, at) if 0 <= j < len(seen)), default=0)
        out.append((tenant, min(best, len(ids) - 1), len(ids)))
        seen.insert(at, ids)
    return out


def independent_prefix_share(
    records: list[dict[str, Any]], tokenizer: PromptTokenizer
) -> tuple[float, dict[str, float]]:
    """Σ reused / Σ prompt tokens, overall and per tenant."""
    reused: dict[str, int] = {}
    total: dict[str, int] = {}
    for tenant, r, n in independent_reuse(records, tokenizer):
        reused[tenant] = reused.get(tenant, 0) + r
        total[tenant] = total.get(tenant, 0) + n
    share = sum(reused.values()) / sum(total.values())
    return share, {t: reused[t] / total[t] for t in total}


def expected_shared_prefix(gen: Generated, tokenizer: PromptTokenizer, share: float = 0.5) -> int:
    """Requests that are not exact repeats and reuse at least `share` of their prompt."""
    return sum(
        1
        for (_, reused, n), repeat in zip(
            independent_reuse(gen.records, tokenizer), gen.truth.exact_repeat, strict=True
        )
        if not repeat and reused >= share * n
    )


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


@pytest.mark.parametrize("make", [support_bot, short_support_bot], ids=["long", "short"])
def test_support_bot_census_matches_the_truth(
    tmp_path: Path, run_analysis: RunAnalysis, make: Any
) -> None:
    gen = make(seed=11, n=1500)
    total = analyse(gen, tmp_path, run_analysis).census.total
    repeats = sum(gen.truth.exact_repeat)
    assert total.requests == 1500
    assert total.classes[Class.EXACT_REPEAT] == repeats
    # Every other request reuses the system prompt, most of its prompt (~470 tokens of ~490,
    # or ~150 of ~175 for the short one): only the very first is unique.
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
    # `notes` requests share nothing: unique; `docs` ones reuse the style guide, which is
    # more than half of some prompts and less of others: counted one by one.
    assert notes.classes[Class.UNIQUE] == notes.requests
    assert census.total.classes[Class.SHARED_PREFIX] == expected_shared_prefix(gen, tokenizer)
    assert 0 < docs.classes[Class.SHARED_PREFIX] < docs.requests
    half = sum(1 for r in gen.records if r["request"].get("temperature") == 0.7)
    assert census.not_cacheable["sampled without a seed"] == half


@pytest.mark.parametrize("min_share", [0.5, 0.9])
def test_multi_turn_chat_census_matches_the_truth(
    tmp_path: Path, run_analysis: RunAnalysis, min_share: float
) -> None:
    gen = multi_turn_chat(seed=2, conversations=60)
    census = analyse(gen, tmp_path, run_analysis, min_prefix_share=min_share).census
    assert census.total.classes[Class.EXACT_REPEAT] == sum(gen.truth.exact_repeat) > 0
    tokenizer = Chars4Tokenizer()
    share = census.total.reused_tokens / census.total.prompt_tokens
    assert share == pytest.approx(independent_prefix_share(gen.records, tokenizer)[0])
    assert share == pytest.approx(structural_prefix_share(gen, tokenizer), abs=0.01)
    shared = expected_shared_prefix(gen, tokenizer, min_share)
    assert census.total.classes[Class.SHARED_PREFIX] == shared > 0
    # how much the shared-prefix requests share is reported beside the class
    assert census.total.shared_tokens > 0
    assert sum(census.shared_tokens.counts) == shared


def test_a_short_shared_system_prompt_is_shared_prefix_whatever_its_length(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    """No absolute bar: a ~150-token system prompt in front of short questions is most of
    each prompt, so those requests are shared_prefix (a 256-token bar called them unique)."""
    gen = short_support_bot(seed=4, n=300)
    census = analyse(gen, tmp_path, run_analysis).census
    total = census.total
    assert total.classes[Class.UNIQUE] == 1
    assert 100 < total.shared_tokens / total.classes[Class.SHARED_PREFIX] < 256
    assert total.prefix_token_share > 0.8


def test_sampled_near_duplicate_estimates_give_back_what_the_unchecked_would_lose() -> None:
    """Four requests not repeats, two of them checked and one of those a near-duplicate that
    would otherwise be shared_prefix: half of the unchecked are expected to be too."""
    tally = Tally()
    for cls, checked, instead in [
        (Class.EXACT_REPEAT, False, None),
        (Class.NEAR_DUPLICATE, True, Class.SHARED_PREFIX),
        (Class.SHARED_PREFIX, True, None),
        (Class.SHARED_PREFIX, False, None),
        (Class.UNIQUE, False, None),
    ]:
        tally.add(cls, 100, 0, True)
        if cls is not Class.EXACT_REPEAT:
            tally.near_check(checked, instead)
    shares = tally.shares()
    assert shares["exact_repeat"] == pytest.approx(1 / 5)
    assert shares["near_duplicate"] == pytest.approx(0.5 * 4 / 5)  # half of the 4 non-repeats
    assert shares["shared_prefix"] == pytest.approx((2 - 2 * 0.5) / 5)
    assert shares["unique"] == pytest.approx(1 / 5)
    assert sum(shares.values()) == pytest.approx(1.0)
    low, high = tally.near_interval() or (0.0, 0.0)
    assert low < shares["near_duplicate"] < high


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
