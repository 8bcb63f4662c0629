"""Issue 10: no reason may contradict a figure shown anywhere in the same report. Over a grid of
analyses (generated days, a redacted log, a block trace; bounded and unbounded KV, prices with
and without a cached-input price, two upstream profiles, a calibrated threshold), every number
in every reason must be one of the figures it quotes; each quoted figure must be the report's
own value at the path it names, formatted as the report's tables format it; and each must
equal the same figure computed afresh from the census and the replays. On the rendered page,
a figure a reason quotes from the census, the tenant table or the replay table reads the same
in that table, and no saved share is over 100%."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.analysis import Analysis
from infercache.analyze.census import Class
from infercache.analyze.cost_model import UpstreamProfile
from infercache.analyze.options import SemanticOptions
from infercache.analyze.report_json import from_json, to_json
from infercache.analyze.report_tree import Figures
from infercache.analyze.reports.document import Report, build_report
from infercache.analyze.reports.replay_numbers import layered, strategy
from infercache.analyze.reports.text import render_text
from infercache.analyze.rules import at
from infercache.metrics import Price, PriceTable
from infercache.semantic.embedder import HashingEmbedder
from infercache.settings import Settings
from infercache.tokenizing.tokenizers import Chars4Tokenizer
from tests.analyze.conftest import MOONCAKE
from tests.analyze.generators import (
    document_qa,
    drafting_tool,
    multi_turn_chat,
    short_support_bot,
    timestamped_support,
    unique_drafts,
    write_twins,
)

LOGS = ["support", "drafts", "docqa", "timestamped", "tenants", "chat", "redacted", "mooncake"]
OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "bounded": {"ttl_s": 60.0, "prefix_capacity_tokens": 4096, "sweep": True},
    "engine-profile": {"upstream": UpstreamProfile.parse("engine")},
    "calibrated": {"semantic": SemanticOptions(0.8, "test", embedder="hashing")},
}
PRICES = {
    "cached-price": PriceTable(default=Price(0.15, 0.6, 0.075)),
    "no-cached-price": PriceTable(default=Price(2.5, 10.0)),
}
NUMBER = re.compile(r"\d")


def write_log(name: str, tmp_path: Path, settings: Settings) -> Path:
    if name == "mooncake":
        return MOONCAKE
    if name == "redacted":
        gen = short_support_bot(seed=8, n=300)
        _, redacted = write_twins(
            gen, tmp_path, secret=b"s" * 32, tokenizer=Chars4Tokenizer(), policy=settings.policy()
        )
        return redacted
    gen = {
        "support": lambda: short_support_bot(seed=8, n=400),
        "drafts": lambda: unique_drafts(seed=8, n=80),
        "docqa": lambda: document_qa(seed=8, n=80),
        "timestamped": lambda: timestamped_support(seed=8, n=200),
        "tenants": lambda: drafting_tool(seed=8, n=300),
        "chat": lambda: multi_turn_chat(seed=8, conversations=40),
    }[name]()
    return gen.write(tmp_path / f"{name}.jsonl")


def expected(analysis: Analysis, path: tuple[str | int, ...]) -> float:
    """The figure at `path`, computed afresh from the census and the replays."""
    census, cost = analysis.census, analysis.cost
    total = census.total
    head = path[0]
    if head == "census":
        return total.shares()[str(path[1])]
    if head == "prefix_token_share":
        return total.reused_tokens / total.prompt_tokens
    if head == "breakdown":
        tally = census.by_tenant[str(path[2])]
        return tally.reused_tokens / tally.prompt_tokens
    if head == "settings":
        return analysis.options.ttl_s
    if head == "near_duplicates":
        if path[1] == "share":
            return total.shares()[Class.NEAR_DUPLICATE.value]
        if path[1] == "interval":
            interval = total.near_interval()
            assert interval is not None
            return interval[int(path[2])]
        if path[1] == "confidence":
            return 0.95
        assert analysis.semantic is not None
        return analysis.semantic.threshold
    if head == "prefix_breakers_summary":
        lost = sum(b.tokens_lost for b in analysis.breakers)
        return min(1.0, (total.reused_tokens + lost) / total.prompt_tokens)
    if head == "simulation":
        name = str(path[1])
        if name == "layered":
            figures = to_json(layered(analysis.replays["layered"], cost).prefix_under_caches)
        else:
            replay = analysis.replays["prefix" if name == "prefix" else "layered"]
            figures = to_json(strategy(replay, name, cost))
        return float(figures[str(path[-1])])
    raise AssertionError(f"a reason quotes {path}, which this test does not know")


def check_reasons(report: dict[str, Any], analysis: Analysis) -> int:
    quoted = 0
    for reason in report["recommendation"]["reasons"]:
        text = reason["text"]
        for quote in reason["quotes"]:
            path = tuple(quote["path"])
            assert quote["value"] == pytest.approx(float(at(report, path)), rel=1e-12), path
            assert quote["value"] == pytest.approx(expected(analysis, path), rel=1e-9), path
            assert quote["shown"] in text, (quote, text)
            quoted += 1
        rest = text
        for shown in sorted((q["shown"] for q in reason["quotes"]), key=len, reverse=True):
            rest = rest.replace(shown, "")
        names = [*report["tenant_names"].values(), *report["breakdown"]["tenant"]]
        for name in sorted(names, key=len, reverse=True):
            rest = rest.replace(name, "")
        assert not NUMBER.search(rest), f"a number no figure backs in: {text!r}"
    return quoted


def check_tables(report: dict[str, Any]) -> None:
    """The figures the reasons quote are the ones the report's own tables show."""
    census, counts = report["census"], report["census_counts"]
    if not report["census_estimated"]:
        for cls in ("exact_repeat", "shared_prefix", "unique"):
            assert census[cls] == pytest.approx(counts[cls] / report["requests"])
    assert sum(census.values()) == pytest.approx(1.0)
    tenants = report["breakdown"]["tenant"]
    if len(tenants) == 1:
        [only] = tenants.values()
        assert only["prefix_token_share"] == pytest.approx(report["prefix_token_share"])


def in_a_table(path: tuple[str | int, ...]) -> bool:
    """Quoted figures the page also shows in a table (the rest only explain a reason: the
    interval's confidence, what fixing a breaker would give, the prefix under the caches)."""
    head = path[0]
    if head in ("census", "prefix_token_share", "breakdown", "settings"):
        return True
    if head == "near_duplicates":
        return path[1] in ("share", "interval")
    return head == "simulation" and path[1] != "layered" and path[-1] != "request_share"


def check_page(built: Report, report: dict[str, Any]) -> None:
    """The text page: every reason whole, and the tables above it show what the reasons quote."""
    out = io.StringIO()
    render_text(built, out, color=False)
    page = " ".join(out.getvalue().split())  # rich wraps long lines
    tables = page.split("Recommendation:")[0]
    for reason in report["recommendation"]["reasons"]:
        assert " ".join(reason["text"].split()) in page
        for quote in reason["quotes"]:
            if in_a_table(tuple(quote["path"])):
                assert quote["shown"] in tables, (quote, tables)
    for name, figures in report["simulation"].items():
        for key, value in figures.items():
            if key.endswith("_share") or key.endswith("hit_rate"):
                assert 0 <= value <= 1, (name, key, value)


@pytest.mark.parametrize("prices", list(PRICES))
@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("log", LOGS)
def test_every_reason_quotes_only_figures_the_report_shows(
    tmp_path: Path, run_analysis: Any, log: str, options: str, prices: str
) -> None:
    settings = Settings(data_dir=tmp_path / "data", prices=PRICES[prices])
    path = write_log(log, tmp_path, settings)
    overrides = dict(OPTIONS[options])
    embedder = HashingEmbedder(dim=128) if "semantic" in overrides else None
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions

    tokenizer = Chars4Tokenizer()
    analysis = Analyzer(
        AnalyzeOptions(**overrides),
        settings=settings,
        tokenizer=lambda: tokenizer,
        embedder=embedder,
    ).run([path])
    built = build_report(analysis)
    report = built.to_dict()
    check_tables(report)
    check_page(built, report)
    assert from_json(Figures, report) == built.figures  # the document holds the whole tree
    for reason in report["recommendation"]["reasons"]:
        for quote in reason["quotes"]:  # and a path reads the tree as it reads the document
            assert at(built.figures, quote["path"]) == at(report, quote["path"])
    assert check_reasons(report, analysis) >= 3  # exact, semantic or prefix quote something
