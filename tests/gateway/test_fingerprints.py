"""Several fingerprints are one model; a newcomer that displaces them for a window is a swap
(gateway/fingerprints.py), driven with the time passed in."""

from __future__ import annotations

import random

import pytest

from infercache.gateway.fingerprints import FingerprintWatch, SwapWindow, token_generation

WINDOW = SwapWindow(seconds=60.0, answers=20)
OPENAI_LIKE = (("fp_76f018034d", 7), ("fp_c5162df67e", 2), ("fp_9c4936e070", 1))


def weighted(rng: random.Random) -> str:
    names, weights = zip(*OPENAI_LIKE, strict=True)
    return rng.choices(names, weights)[0]


@pytest.mark.parametrize("seconds_apart", [0.01, 1.0, 600.0])
def test_fingerprints_picked_at_random_never_displace_each_other(seconds_apart: float) -> None:
    """At 100 answers a second, one a second and one every ten minutes: 20,000 answers with
    OpenAI's three co-live fingerprints (7:2:1) are one version throughout."""
    rng = random.Random(1)
    watch = FingerprintWatch(WINDOW)
    for i in range(20_000):
        assert watch.observe(weighted(rng), i * seconds_apart, "0:") is None
    assert set(watch.answers) == {fp for fp, _ in OPENAI_LIKE}


def test_a_newcomer_that_displaces_them_all_for_the_window_is_a_new_version() -> None:
    rng = random.Random(2)
    watch = FingerprintWatch(WINDOW)
    t = 0.0
    for _ in range(100):
        t += 1.0
        watch.observe(weighted(rng), t, "0:")
    found = None
    answers = 0
    while found is None and answers < 200:
        t += 1.0
        answers += 1
        found = watch.observe("fp_new", t, "0:")
    assert found is not None
    assert answers == 60  # 60 s of silence, over at least 20 answers: whichever comes later
    assert found.version == "fp_new"
    assert set(found.displaced) <= {fp for fp, _ in OPENAI_LIKE}
    assert found.answers == 60
    watch.swapped(found, "1:fp_new", t)
    assert all(watch.observe("fp_new", t + k, "1:fp_new") is None for k in range(500))


def test_a_fast_swap_still_waits_for_the_window_and_a_slow_one_for_the_answers() -> None:
    fast, slow = FingerprintWatch(WINDOW), FingerprintWatch(WINDOW)
    for k in range(20):
        fast.observe("fp_a", k * 0.01, "0:")
        slow.observe("fp_a", k * 1000.0, "0:")
    hits = [fast.observe("fp_b", 1 + k * 0.01, "0:") for k in range(1000)]
    assert [h for h in hits if h is not None] == []  # 10 s of answers is not 60 s of silence
    assert fast.observe("fp_b", 61.0, "0:") is not None
    slow_hits = [slow.observe("fp_b", 20_000 + k * 1000.0, "0:") for k in range(20)]
    assert [h is not None for h in slow_hits] == [False] * 19 + [True]


def test_one_founder_answer_resets_the_displacement() -> None:
    watch = FingerprintWatch(WINDOW)
    for k in range(20):
        watch.observe("fp_a", float(k), "0:")
    for k in range(19):
        assert watch.observe("fp_b", 100.0 + k, "0:") is None
    watch.observe("fp_a", 200.0, "0:")  # an old replica still answers
    assert all(watch.observe("fp_b", 201.0 + k, "0:") is None for k in range(59))
    assert watch.observe("fp_b", 261.0, "0:") is not None


def test_a_version_recorded_elsewhere_starts_a_new_epoch_and_is_never_undone() -> None:
    """The admin API, the CLI or another gateway moved the token: the fingerprints after it are
    its own, and an answer looked up before it (an older token) changes nothing."""
    watch = FingerprintWatch(WINDOW)
    for k in range(20):
        watch.observe("fp_a", float(k), "3:fp_a")
    for k in range(200):
        assert watch.observe("fp_b", 100.0 + k, "4:v2") is None  # founders of the new epoch
        assert watch.observe("fp_b", 100.5 + k, "3:fp_a") is None  # looked up before it
    assert watch.token == "4:v2"
    assert watch.founders == {"fp_b"}


def test_an_unreadable_store_still_founds_an_epoch() -> None:
    watch = FingerprintWatch(WINDOW)
    assert all(watch.observe("fp_a", float(k), None) is None for k in range(20))
    assert all(watch.observe("fp_b", 20.0 + k * 0.1, None) is None for k in range(100))


def test_token_generations() -> None:
    assert token_generation("0:") == 0
    assert token_generation("12:fp_x") == 12
    assert token_generation("garbage") == 0
    with pytest.raises(ValueError, match="window"):
        SwapWindow(seconds=-1)
