"""Greedy and seeded nucleus sampling."""

from __future__ import annotations

import pytest
import torch

from infercache.engine.sampling import Sampler, SamplingParams

LOGITS = torch.tensor([0.0, 3.0, 2.9, -1.0, 1.0])


def draws(params: SamplingParams, n: int = 200) -> list[int]:
    sampler = Sampler(params)
    return [sampler(LOGITS) for _ in range(n)]


def test_greedy_takes_the_argmax() -> None:
    assert draws(SamplingParams(max_tokens=1, temperature=0), 3) == [1, 1, 1]


def test_greedy_breaks_ties_by_lowest_id() -> None:
    sampler = Sampler(SamplingParams(max_tokens=1, temperature=0))
    assert sampler(torch.tensor([1.0, 5.0, 5.0])) == 1


def test_same_seed_gives_the_same_draws_and_another_seed_differs() -> None:
    a = draws(SamplingParams(max_tokens=1, temperature=1.0, seed=7))
    b = draws(SamplingParams(max_tokens=1, temperature=1.0, seed=7))
    c = draws(SamplingParams(max_tokens=1, temperature=1.0, seed=8))
    assert a == b
    assert a != c
    assert set(a) >= {0, 1, 2, 4}  # a full distribution is sampled


def test_top_p_keeps_only_the_nucleus() -> None:
    # softmax(LOGITS): token 1 ≈ 0.47, token 2 ≈ 0.42; 1 and 2 reach top_p=0.8.
    assert set(draws(SamplingParams(max_tokens=1, temperature=1.0, top_p=0.8, seed=1))) == {1, 2}


def test_top_p_zero_still_keeps_the_most_probable_token() -> None:
    assert set(draws(SamplingParams(max_tokens=1, temperature=1.0, top_p=0.0, seed=1))) == {1}


@pytest.mark.parametrize(
    ("field", "value"), [("max_tokens", 0), ("temperature", -1.0), ("top_p", 1.5)]
)
def test_invalid_parameters_are_refused(field: str, value: float) -> None:
    kwargs: dict[str, float] = {"max_tokens": 1, field: value}
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)  # type: ignore[arg-type]
