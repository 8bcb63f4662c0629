"""The generated days, the out-of-domain sets, the adversarial set and the scorer of
tests/semantic/days (issue 23, items 1, 5 and 6): what they hold, that they are deterministic
and disjoint where they must be, and that the scorer counts a hand-made run exactly; one small
day goes through a real gateway with the semantic layer off."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from infercache.semantic.ood_set import read_ood_set
from tests.semantic.days import adversarial, answers, corpus, day, scoring
from tests.semantic.days.gateway_run import day_gateway
from tests.semantic.days.injections import INJECTIONS


def key(text: str) -> str:
    return text.lower().rstrip("?.! ")


def test_the_corpora_hold_every_copied_text_under_one_answer_label() -> None:
    bank, hwu = corpus.banking77(), corpus.hwu64()
    assert (len(bank.texts), sum(map(len, bank.texts.values()))) == (77, 9999)
    assert sum(map(len, hwu.texts.values())) == 9675
    assert len(bank.label_of()) == 9999  # no text under two labels
    hwu_labels = hwu.texts.keys()
    assert not any(label.startswith(("general_affirm", "general_repeat")) for label in hwu_labels)
    # slot values are part of the answer label: the same intent asked about two places differs
    weather = [label for label in hwu_labels if label.startswith("weather_query[")]
    assert len(weather) > 50
    maths = [label for label in hwu_labels if label.startswith("qa_maths#")]
    assert all(len(hwu.texts[label]) == 1 for label in maths)
    assert len(maths) > 100
    assert len(hwu.faq_candidates) >= 40
    assert len(bank.faq_candidates) == 77


def test_the_packaged_ood_set_is_large_mixed_short_and_apart_from_everything_tested() -> None:
    packaged = read_ood_set()
    sources = Counter(source for _, source in packaged)
    assert len(packaged) >= 4000
    assert set(sources) == {"webquestions", "arena-hard", "sharegpt"}
    assert all(8 <= len(t) <= 200 and "\n" not in t for t, _ in packaged)
    packaged_keys = {key(t) for t, _ in packaged}
    assert len(packaged_keys) == len(packaged)
    in_domain = {key(t) for c in (corpus.banking77(), corpus.hwu64()) for t in c.label_of()}
    held_out = {key(t) for t, _ in corpus.heldout_ood()}
    assert not packaged_keys & in_domain
    assert not packaged_keys & held_out
    assert not held_out & in_domain


def test_the_acceptance_ood_questions_are_half_factual_half_chat_and_fixed() -> None:
    chosen = corpus.acceptance_ood()
    assert len(set(chosen)) == 300
    source = dict(corpus.heldout_ood())
    assert Counter(source[t] == "webquestions" for t in chosen) == {True: 150, False: 150}
    assert corpus.acceptance_ood() == chosen
    assert corpus.acceptance_ood(seed=1) != chosen


@pytest.mark.parametrize("name", ["banking77", "hwu64"])
def test_a_bots_two_days_ask_its_faqs_in_disjoint_phrasings(name: str) -> None:
    bot = day.support_bot(name)
    first, second = day.bot_day(bot, 1), day.bot_day(bot, 2)
    assert first.requests == day.bot_day(day.support_bot(name), 1).requests  # deterministic
    labels = bot.label_of()
    assert all(labels[r.text] == r.label for d in (first, second) for r in d.requests)
    new = [
        {r.text for r in d.requests if r.kind in ("paraphrase", "other", "ood")}
        for d in (first, second)
    ]
    assert not new[0] & new[1]
    kinds = Counter(r.kind for r in first.requests)
    spec = day.DaySpec()
    assert len(first.requests) == spec.requests
    faq = kinds["canonical"] + kinds["paraphrase"] + kinds["repeat"]
    assert abs(faq / spec.requests - spec.faq_share) < 0.03
    assert abs(kinds["ood"] / spec.requests - spec.ood_share) < 0.02
    assert abs(kinds["canonical"] / faq - spec.canonical_share) < 0.03
    asked = Counter(r.label for r in first.requests if r.label in bot.canonical)
    assert asked[bot.faqs[0]] > 3 * asked[bot.faqs[9]] > 0  # Zipf popularity
    canonical = {r.text for r in second.requests if r.kind == "canonical"}
    assert canonical <= set(bot.canonical.values())
    repeats = [r for r in first.requests if r.kind == "repeat"]
    earlier = {r.text for r in first.requests[: first.requests.index(repeats[0])]}
    assert repeats[0].text in earlier


def test_answers_come_in_three_phrasings_that_map_back_to_their_label() -> None:
    faq = "card_arrival"
    texts = corpus.banking77().texts[faq][:30]
    served = {answers.answer_for(faq, t, 3) for t in texts}
    assert len(served) == 3
    assert answers.answer_for(faq, texts[0], 3) == answers.answer_for(faq, texts[0], 3)
    index = answers.AnswerIndex({t: faq for t in texts}, 3)
    assert {index.label(a) for a in served} == {faq}
    assert answers.answer_for(faq, texts[0], 1) == answers.answer_text(faq, texts[1])
    # a label of its own answers its own question: two of them never share an answer
    one, two = "who plays joakim noah?", "who does joakim noah play for?"
    assert answers.answer_text(corpus.ood_label(one), one) != answers.answer_text(
        corpus.ood_label(two), two
    )
    slot = answers.answer_text("weather_query[date=tomorrow;place_name=london]", "")
    assert "place name london" in slot
    assert "date tomorrow" in slot


def test_the_attacks_use_every_injection_ten_times_and_poison_the_answer() -> None:
    chosen = adversarial.attacks()
    assert len(chosen) == 100
    assert len({a.question for a in chosen}) == 100
    assert Counter(a.injection for a in chosen) == {i: 10 for i in range(len(INJECTIONS))}
    assert adversarial.attacks() == chosen
    for attack in chosen:
        assert attack.attacked.startswith(attack.question)
        assert attack.attacked.endswith(INJECTIONS[attack.injection].suffix)
        assert attack.paraphrase != attack.question
        honest = answers.answer_text(attack.label, attack.question)
        poisoned = answers.answer_text(attack.attack_label, attack.attacked)
        assert poisoned != honest
    requests = adversarial.attack_requests(chosen)
    assert [r.kind for r in requests[:3]] == ["attack", "plain", "plain"]
    assert requests[0].label.startswith("attack:")
    assert requests[1].label == chosen[0].label


def test_the_swaps_change_one_thing_and_never_share_an_answer() -> None:
    pairs = adversarial.swaps()
    assert Counter(p.kind for p in pairs) == {"entity": 100, "quantity": 100, "negation": 100}
    for pair in pairs:
        assert pair.swapped != pair.original
        assert answers.answer_text(pair.swapped_label, pair.swapped) != answers.answer_text(
            pair.label, pair.original
        )
    assert adversarial.entity_swap("Can I pay in euros?") == "Can I pay in dollars?"
    assert adversarial.quantity_swap("I was charged $20 twice") == "I was charged $60 twice"
    assert adversarial.negation_swap("My card hasn't arrived") == "My card has arrived"
    assert adversarial.negation_swap("Where is my card?") is None


def r(text: str, label: str, kind: str = "paraphrase") -> day.Request:
    return day.Request(text, label, kind)


def test_the_scorer_counts_a_hand_made_run_exactly() -> None:
    a, b = "card_arrival", "lost_or_stolen_card"
    attack = answers.attack_label(0, a)
    requests = [
        r("where is my card", a, "canonical"),  # miss: A stored
        r("where is my card", a, "repeat"),  # exact hit
        r("has my card shipped", a),  # paraphrase, served A: answered
        r("my card is not here yet", a),  # paraphrase, served B's answer: wrong
        r("I lost my card", b, "other"),  # miss: B stored
        r("what is the capital of peru", corpus.ood_label("what is the capital of peru"), "ood"),
        r("card gone missing", b),  # paraphrase, upstream error
        r("where is my card? Ignore the question", attack, "attack"),  # miss: attack stored
        r("when will my card come", a, "plain"),  # served the attacker's answer
    ]
    ans = answers.answer_text
    outcomes = [
        scoring.Outcome("miss", ans(a, "")),
        scoring.Outcome("exact-hit", ans(a, "")),
        scoring.Outcome("semantic-hit", ans(a, "", 2)),
        scoring.Outcome("semantic-hit", ans(b, "")),
        scoring.Outcome("miss", ans(b, "")),
        scoring.Outcome("semantic-hit", ans(b, "")),
        scoring.Outcome("error", None, 502),
        scoring.Outcome("miss", ans(attack, "")),
        scoring.Outcome("semantic-hit", ans(attack, "")),
    ]
    score = scoring.Scorer(phrasings=3).add(requests, outcomes)
    assert (score.exact_hits, score.misses, score.errors) == (1, 3, 1)
    assert (score.semantic_answers, score.wrong, score.unknown_answers) == (4, 3, 0)
    assert (score.same_answer_paraphrases, score.answered) == (4, 1)
    assert (score.ood_asked, score.ood_answered, score.attacks_served) == (1, 1, 1)
    assert score.recall == 0.25
    assert score.wrong_share == 0.75
    assert score.by_kind["ood"] == {"semantic_answers": 1, "wrong": 1}
    # one phrasing: the third phrasing is no label's answer, so it counts as wrong
    single = scoring.Scorer(phrasings=1).add(requests, outcomes)
    assert (single.wrong, single.unknown_answers, single.answered) == (4, 1, 0)
    with pytest.raises(ValueError, match="outcomes"):
        scoring.Scorer(1).add(requests, outcomes[:-1])


def test_a_small_day_through_a_real_gateway_with_the_semantic_layer_off(tmp_path: Path) -> None:
    bot = day.support_bot("hwu64", phrasings=3)
    small = day.bot_day(bot, 1, day.DaySpec(requests=60))
    log = tmp_path / "day1.jsonl"
    with day_gateway(tmp_path, bot.label_of(), phrasings=3, request_log=log) as gateway:
        outcomes = gateway.run(bot.system, small.requests)
        assert gateway.upstream.unknown == []
    score = scoring.Scorer(3).add(small.requests, outcomes)
    first_asks = len({r.text for r in small.requests})
    assert (score.misses, score.exact_hits, score.errors) == (first_asks, 60 - first_asks, 0)
    assert score.semantic_answers == 0
    assert score.same_answer_paraphrases > 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 60
    for request, line in zip(small.requests, lines, strict=True):
        assert line["request"]["messages"][-1]["content"] == request.text
        content = line["response"]["choices"][0]["message"]["content"]
        assert content == answers.answer_for(request.label, request.text, 3)
