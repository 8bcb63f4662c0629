"""Guards veto matches where meaning flips; `accept` is the one rule built on them."""

from __future__ import annotations

import csv
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infercache.errors import ConfigError
from infercache.semantic.decision import Decision, Reason, accept
from infercache.semantic.guards import (
    CurrencyGuard,
    DateGuard,
    EntityGuard,
    NegationGuard,
    NumberGuard,
    build_guards,
    default_guards,
    guard_names,
)
from infercache.semantic.tuning.pairs import Pair
from tests.semantic.conftest import HARD_CASES


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("cancel order 1234", {"1234"}),
        ("I need two tickets", {"2"}),
        ("twenty five people and one hundred chairs", {"25", "100"}),
        ("I want a new one", set()),
        ("balance of 1,234.50 on the 3rd", {"1234.5", "3"}),
        ("pick 1,2,3", {"1", "2", "3"}),
        ("a dozen eggs", {"12"}),
        ("three thousand two hundred", {"3200"}),
    ],
)
def test_number_guard_reads_digits_and_written_numbers(text: str, numbers: set[str]) -> None:
    assert NumberGuard().features(text) == numbers


@pytest.mark.parametrize(
    ("text", "dates"),
    [
        ("wake me at 7am tomorrow", {"am", "tomorrow"}),
        ("meet at 3 p.m. on Friday", {"pm", "friday"}),
        ("What's on May 5?", {"may"}),
        ("I may be late", set()),
        ("what is on next week", {"next week"}),
        ("tomorrow's weather", {"tomorrow"}),
    ],
)
def test_date_guard_reads_dates_and_times(text: str, dates: set[str]) -> None:
    assert DateGuard().features(text) == dates


def test_currency_guard_maps_symbols_codes_and_names_to_one_code() -> None:
    guard = CurrencyGuard()
    assert guard.features("send $5 or 5 usd or five dollars") == {"USD"}
    assert guard.features("€10 and 10 GBP") == {"EUR", "GBP"}
    assert guard.check("Pay 50 dollars", "Send $50")
    assert not guard.check("Pay 50 dollars", "Pay 50 euros")


@pytest.mark.parametrize(
    "negated",
    ["it is not here", "I can't log in", "I cant log in", "never again", "without a fee", "no"],
)
def test_negation_guard_sees_negation_cues(negated: str) -> None:
    assert NegationGuard().features(negated) == {"negated:1"}
    assert NegationGuard().features("it is here, I can log in") == frozenset()


def test_negation_guard_counts_negations_so_removing_one_of_two_is_seen() -> None:
    two = "Why wasn't my top-up accepted? I can't find the money."
    assert NegationGuard().features(two) == {"negated:2"}
    assert not NegationGuard().check(two, "Why was my top-up accepted? I can't find the money.")


def test_entity_guard_ignores_sentence_starts_and_the_pronoun_i() -> None:
    guard = EntityGuard()
    assert guard.features("Where is Paris? Tell me. I like ATM fees") == {"paris", "atm"}
    assert guard.features("The cat sat") == frozenset()


def test_entity_guard_accepts_title_case_against_lower_case() -> None:
    headline = "Spain Princess Testifies in Historic Fraud Probe"
    assert EntityGuard().check(headline, headline.lower())


def test_conflict_mode_vetoes_swaps_but_not_an_added_detail() -> None:
    conflict, differ = EntityGuard("conflict"), EntityGuard("differ")
    swap = ("flights from Paris to London", "flights from Paris to Berlin")
    added = ("flights to London", "flights to London with BA")
    assert not conflict.check(*swap)
    assert not differ.check(*swap)
    assert conflict.check(*added)
    assert not differ.check(*added)


def test_guard_names_round_trip_through_build_guards() -> None:
    guards = build_guards(["numbers", "entities:conflict"])
    assert [g.name for g in guards] == ["numbers", "entities:conflict"]
    assert [g.name for g in build_guards(g.name for g in default_guards())] == [
        g.name for g in default_guards()
    ]
    assert set(guard_names()) == {
        *("numbers", "dates", "currencies", "negation", "entities"),
        *("surplus", "contacts", "instructions", "swaps"),
    }


def test_unknown_guards_and_modes_are_config_errors_naming_them() -> None:
    with pytest.raises(ConfigError, match="'colours'"):
        build_guards(["colours"])
    with pytest.raises(ConfigError, match="'sometimes'"):
        build_guards(["numbers:sometimes"])


PIECES = [*"abc XYZ 0123 $€.,!?'", "not ", "two ", "May ", "Paris ", "tomorrow ", "n't "]
text = st.lists(st.sampled_from([*PIECES, "dollars ", "3rd ", "I "]), max_size=15).map("".join)


@given(a=text, b=text)
def test_every_guard_is_symmetric_and_accepts_identical_texts(a: str, b: str) -> None:
    for guard in [
        *build_guards(["numbers", "dates", "currencies", "negation", "entities"]),
        EntityGuard("conflict"),
        NumberGuard("conflict"),
    ]:
        assert guard.check(a, b) == guard.check(b, a), guard.name
        assert guard.check(a, a), guard.name


def hard_case_kinds() -> list[str]:
    with HARD_CASES.open(encoding="utf-8", newline="") as handle:
        return [row["kind"] for row in csv.DictReader(handle, delimiter="\t")]


def test_all_guards_veto_every_hard_negative_and_keep_all_but_one_positive(
    hard_cases: list[Pair],
) -> None:
    guards = build_guards(["numbers", "dates", "currencies", "negation", "entities:conflict"])
    decisions = [(p, accept(1.0, p.a, p.b, 0.5, guards)) for p in hard_cases]
    negatives = [d for p, d in decisions if not p.same]
    vetoed_positives = [(p.a, p.b) for p, d in decisions if p.same and not d.accepted]
    assert len(negatives) >= 30
    assert not any(d.accepted for d in negatives)
    assert all(d.reason is Reason.GUARD and d.guard for d in negatives)
    # The one known cost: "hasn't" in a paraphrase that adds a negation the query lacks.
    assert vetoed_positives == [("Where is my card?", "My card hasn't come yet, where is it?")]


def test_default_guards_veto_the_number_date_and_negation_hard_negatives(
    hard_cases: list[Pair],
) -> None:
    kinds = hard_case_kinds()
    assert len(kinds) == len(hard_cases)
    for pair, kind in zip(hard_cases, kinds, strict=True):
        decision = accept(1.0, pair.a, pair.b, 0.5, default_guards())
        if not pair.same and kind in ("numbers", "dates", "negation"):
            assert decision.guard == kind, (pair, decision)
        if not pair.same and kind in ("currencies", "entities"):
            assert decision.guard in (None, "numbers", "swaps"), (
                pair,
                decision,
            )  # not on by default


def test_accept_rejects_below_the_threshold_before_any_guard() -> None:
    decision = accept(0.5, "order 1", "order 2", 0.8, default_guards())
    assert decision == Decision(False, Reason.BELOW_THRESHOLD)


def test_accept_names_the_first_vetoing_guard() -> None:
    decision = accept(0.95, "not order 1", "order 2", 0.8, build_guards(["numbers", "negation"]))
    assert decision == Decision(False, Reason.GUARD, "numbers")


def test_accept_at_exactly_the_threshold_accepts() -> None:
    assert accept(0.8, "a", "b", 0.8, []) == Decision(True, Reason.ACCEPTED)


@pytest.mark.parametrize(("similarity", "threshold"), [(math.nan, 0.5), (0.5, math.inf)])
def test_accept_refuses_non_finite_numbers(similarity: float, threshold: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        accept(similarity, "a", "b", threshold, [])


@given(
    similarity=st.floats(-1, 1),
    low=st.floats(-1, 1),
    high=st.floats(-1, 1),
    a=text,
    b=text,
)
def test_acceptance_is_monotone_in_the_threshold(
    similarity: float, low: float, high: float, a: str, b: str
) -> None:
    low, high = min(low, high), max(low, high)
    guards = default_guards()
    if accept(similarity, a, b, high, guards).accepted:
        assert accept(similarity, a, b, low, guards).accepted
