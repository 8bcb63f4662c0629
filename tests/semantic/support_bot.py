"""A support bot for tests: intents with several phrasings each, a stand-in upstream that answers
every question with its intent's answer, and a seeded day of traffic (Zipf over intents, half
exact repeats). Phrasings share their intent's core words, so the n-gram twin embedder finds
them; two intents (`reset-password`, `reset-pin`) differ by one word, so a loose threshold
serves wrong answers — what calibration must avoid."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from tests.harness.vocabulary import chat

CORES = {
    "reset-password": "how do I reset my password",
    "reset-pin": "how do I reset my card pin",
    "parcel": "where is my parcel right now",
    "cancel": "cancel my subscription to the premium plan",
    "address": "update the billing address on my account",
    "savings": "open a savings account for my child",
    "lost-card": "report a lost or stolen card",
    "refund": "get a refund for a damaged item",
    "invoice": "download the invoice for my last order",
    "delete": "delete my account and all my data",
}
OPENERS = ["", "hi, ", "hello, ", "quick question: ", "please tell me ", "can you explain "]
CLOSERS = ["", "?", " please", " thanks", " for me", " if possible"]


def phrasings(core: str) -> list[str]:
    return [f"{o}{core}{c}" for o in OPENERS for c in CLOSERS]


def texts_by_intent() -> dict[str, list[str]]:
    return {intent: phrasings(core) for intent, core in CORES.items()}


def answer_of(intent: str) -> str:
    return f"The answer for {intent}: follow these steps."


class IntentUpstream:
    """Answers each question with its intent's answer (`answers` may be swapped to make the
    cached answers go stale); counts calls."""

    def __init__(self) -> None:
        self.intent_of = {t: i for i, texts in texts_by_intent().items() for t in texts}
        self.answer_of: Callable[[str], str] = answer_of
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        intent = self.intent_of[body["messages"][-1]["content"]]
        return {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.answer_of(intent)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40},
        }


def ask(text: str) -> dict[str, Any]:
    return chat(text, system="You are a support bot.", model="support-model")


def day(requests: int, seed: int) -> list[tuple[str, str]]:
    """(question, intent) pairs: Zipf over intents, half of them exact repeats."""
    rng = random.Random(seed)
    pools = {i: rng.sample(t, len(t)) for i, t in texts_by_intent().items()}
    intents = list(pools)
    rng.shuffle(intents)
    weights = [1.0 / (rank + 1) for rank in range(len(intents))]
    asked: dict[str, list[str]] = defaultdict(list)
    out = []
    for _ in range(requests):
        intent = rng.choices(intents, weights)[0]
        if asked[intent] and (rng.random() < 0.5 or not pools[intent]):
            text = rng.choice(asked[intent])
        else:
            text = pools[intent].pop()
            asked[intent].append(text)
        out.append((text, intent))
    return out


class InlineExecutor(Executor):
    """Runs background work at once, so a test sees its effect without waiting."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future
