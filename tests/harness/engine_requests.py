"""What the built-in engine's tests send and account: a chat body for the model being served,
and a request's accounting (`RequestStats`) with the timings a test does not care about."""

from __future__ import annotations

from typing import Any

from infercache.engine.accounting import RequestStats

SYSTEM = "You are a helpful assistant. Answer the question briefly and politely. " * 4


def engine_chat(model: str, question: str, /, *, max_tokens: int, **fields: Any) -> dict[str, Any]:
    """A greedy chat body for `model` behind a shared system prompt (its KV is reusable)."""
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
        **fields,
    }


def request_stats(prompt: int, cached: int, completion: int, **fields: float) -> RequestStats:
    """One request's accounting: its token counts; queue and lookup 0 s, the rest 0.1 s unless
    given (and any other field of `RequestStats`)."""
    seconds = {"queue_s": 0.0, "lookup_s": 0.0, "prefill_s": 0.1, "decode_s": 0.1, "ttft_s": 0.1}
    return RequestStats(prompt, cached, completion, **{**seconds, **fields})  # type: ignore[arg-type]
