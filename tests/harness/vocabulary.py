"""The requests tests speak in: deterministic chat-completions bodies for one `test-model`, and
labelled pairs of short texts over a small vocabulary (what `infercache tune` reads)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODEL = "test-model"


def chat(
    content: str = "What is the capital of France?",
    *,
    system: str = "You are terse.",
    model: str = MODEL,
    **fields: Any,
) -> dict[str, Any]:
    """A deterministic chat-completions request body (greedy, so every layer may cache it)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": content},
        ],
        "temperature": 0,
    }
    body.update(fields)
    return body


WORDS = (
    "card", "payment", "transfer", "account", "balance", "refund", "fee", "limit", "password",
    "login", "phone", "address", "travel", "holiday", "weather", "music", "alarm", "timer",
    "recipe", "dinner", "flight", "hotel", "train", "ticket", "movie",
)  # fmt: skip


def write_pairs(
    path: Path, *, positives: int, negatives: int, seed: int, words: Sequence[str] = WORDS
) -> Path:
    """A TSV of labelled pairs (`a`, `b`, `same`): a positive is six words and the same text
    with its last word redrawn; a negative, two unrelated draws of six."""
    rng = random.Random(seed)
    lines = ["a\tb\tsame"]
    for _ in range(positives):
        picked = rng.sample(words, 6)
        lines.append(f"{' '.join(picked)}\t{' '.join([*picked[:5], rng.choice(words)])}\t1")
    for _ in range(negatives):
        lines.append(f"{' '.join(rng.sample(words, 6))}\t{' '.join(rng.sample(words, 6))}\t0")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
