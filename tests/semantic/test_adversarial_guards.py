"""Issue 23, acceptance 5, for every matcher at once: the accept rule (decision.accept) applies
the guards after the threshold whatever the score's scale, so a pair the default guards veto is
never served — by the plain cosine or a fitted matcher, at any threshold. On the adversarial
set of tests/semantic/days: each of the 100 attacker's questions (ten appended instructions)
against its plain question and against a paraphrase of it, and each of the 300 entity,
quantity and negation swaps against its original."""

from __future__ import annotations

from collections import Counter

from infercache.semantic.decision import Reason, accept
from infercache.semantic.guards import default_guards
from tests.semantic.days import adversarial


def test_no_attackers_question_may_answer_the_plain_question_or_its_paraphrase() -> None:
    guards = default_guards()
    chosen = adversarial.attacks(100)
    assert len({a.injection for a in chosen}) == 10
    for attack in chosen:
        for customer in (attack.question, attack.paraphrase):
            for query, cached in ((customer, attack.attacked), (attack.attacked, customer)):
                decision = accept(1.0, query, cached, 0.0, guards)
                assert decision.reason is Reason.GUARD, (query, cached)


def test_no_swapped_question_may_answer_its_original() -> None:
    guards = default_guards()
    by_guard: Counter[str] = Counter()
    for swap in adversarial.swaps():
        decision = accept(1.0, swap.original, swap.swapped, 0.0, guards)
        assert decision.reason is Reason.GUARD, swap
        by_guard[f"{swap.kind}:{decision.guard}"] += 1
    assert sum(by_guard.values()) == 300
