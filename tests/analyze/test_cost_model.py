"""Issue 10, item 2: a cost model from the log. Rates fitted per model from the timings the
gateway's request log carries (with and without a time to first token), a named profile
otherwise, and the report says which."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from infercache.analyze.cost_model import (
    ENGINE,
    PROVIDER,
    CostModel,
    RateFit,
    SecondsLedger,
    Timing,
    UpstreamProfile,
)
from infercache.analyze.reports.document import build_report
from infercache.errors import ConfigError
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import Rates, short_support_bot, vary_prompt_lengths, with_timings


def synthetic(rates: Rates, n: int, *, seed: int = 0, ttft: bool = False) -> list[Timing]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt, completion = rng.randint(50, 5000), rng.randint(10, 400)
        first = rates.overhead_s + prompt / rates.prefill_tokens_per_s + rng.gauss(0, 0.02)
        total = first + completion / rates.decode_tokens_per_s + rng.gauss(0, 0.02)
        out.append(Timing(total, first if ttft else None, prompt, completion))
    return out


@pytest.mark.parametrize("ttft", [False, True])
def test_rates_are_recovered_from_timings(ttft: bool) -> None:
    truth = Rates(overhead_s=0.3, prefill_tokens_per_s=2500.0, decode_tokens_per_s=45.0)
    fit = RateFit()
    for timing in synthetic(truth, 400, ttft=ttft):
        fit.add("m", timing)
    rates, how = fit.fit("m")
    assert rates is not None, how
    assert rates.prefill_tokens_per_s == pytest.approx(2500.0, rel=0.05)
    assert rates.decode_tokens_per_s == pytest.approx(45.0, rel=0.05)
    assert rates.overhead_s == pytest.approx(0.3, abs=0.02)
    assert how == f"fitted on 400 timed records{' (with TTFT)' if ttft else ''}"


def test_a_fit_the_timings_cannot_support_keeps_the_profile_and_says_why() -> None:
    few = RateFit()
    for timing in synthetic(Rates(), 10):
        few.add("m", timing)
    assert few.fit("m") == (None, "10 timed upstream record(s), fewer than 30")
    flat = RateFit()  # time does not depend on the prompt: noise only
    rng = random.Random(1)
    for _ in range(200):
        flat.add(
            "m", Timing(1.0 + rng.gauss(0, 0.3), None, rng.randint(50, 5000), rng.randint(10, 400))
        )
    rates, why = flat.fit("m")
    assert rates is None
    assert "prompt length explains too little of the time" in why or "non-positive" in why
    cost = CostModel.decide(flat, ["m", "SmolLM2-135M-Instruct"], UpstreamProfile())
    assert cost.rates("m") == PROVIDER
    assert cost.rates("SmolLM2-135M-Instruct") == ENGINE  # the packaged engine's own profile
    assert cost.by_model["m"].source.startswith("profile provider: ")


def test_profiles_parse_and_a_bad_one_is_a_clear_error() -> None:
    assert UpstreamProfile.parse("engine").rates == ENGINE
    assert UpstreamProfile.parse("auto").rates is None
    custom = UpstreamProfile.parse("4000,60").rates
    assert custom is not None
    assert (custom.prefill_tokens_per_s, custom.decode_tokens_per_s) == (4000.0, 60.0)
    with pytest.raises(ConfigError, match="--upstream-profile 'fast'"):
        UpstreamProfile.parse("fast")
    with pytest.raises(ConfigError, match="positive"):
        UpstreamProfile.parse("0,60")
    fit = RateFit()
    for timing in synthetic(Rates(), 100):
        fit.add("m", timing)
    chosen = CostModel.decide(fit, ["m"], UpstreamProfile.parse("engine"))
    assert chosen.rates("m") == ENGINE  # a profile given wins over the log's timings


def test_a_ledger_prices_measured_and_estimated_seconds_once_rates_are_known() -> None:
    ledger = SecondsLedger()
    ledger.add_call("m", 2.5, 100, 10)
    ledger.add_call("m", None, 1000, 50)
    ledger.add_prefill("m", 3000)
    cost = CostModel.decide(RateFit(), ["m"], UpstreamProfile.parse("1000,50"))
    assert ledger.total_s(cost) == pytest.approx(2.5 + (0.3 + 1.0 + 1.0) + 3.0)
    assert ledger.estimated_calls == 1


def test_the_report_fits_the_logged_timings_and_prices_prefix_reuse_with_them(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    truth = Rates(overhead_s=0.2, prefill_tokens_per_s=1500.0, decode_tokens_per_s=30.0, ttft=True)
    gen = with_timings(vary_prompt_lengths(short_support_bot(seed=3, n=600)), truth)
    report = build_report(run_analysis([gen.write(tmp_path / "log.jsonl")])).to_dict()
    model = report["cost_model"]["models"]["gpt-4o-mini"]
    assert model["fitted"] is True
    assert model["source"] == "fitted on 600 timed records (with TTFT)"
    assert model["prefill_tokens_per_s"] == pytest.approx(1500.0, rel=0.05)
    assert any("fitted on 600 timed records" in note for note in report["notes"])
    prefix = report["simulation"]["prefix"]
    expected = prefix["prompt_tokens_saved"] / model["prefill_tokens_per_s"]
    assert prefix["upstream_s_saved"] == pytest.approx(expected)
