"""Chat templating and streaming detokenization."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.weights import load_checkpoint

TEXTS = ["Naïve café 😀 東京!", "plain ascii text", "😀😀😀 🇫🇷", "line\nbreak\ttab"]


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_dir: Path) -> ChatTokenizer:
    ck = load_checkpoint(tiny_dir)
    return ChatTokenizer(ck.tokenizer, ck.eos_token_ids)


def streamed(tokenizer: ChatTokenizer, ids: list[int]) -> list[str]:
    detok = tokenizer.detokenizer()
    deltas = [detok.add(i) for i in ids]
    return [*deltas, detok.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_deltas_rebuild_the_text_without_broken_characters(
    tiny_tokenizer: ChatTokenizer, text: str
) -> None:
    ids = tiny_tokenizer.encode(text)
    deltas = streamed(tiny_tokenizer, ids)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_a_character_spanning_tokens_is_emitted_once_complete(
    tiny_tokenizer: ChatTokenizer,
) -> None:
    ids = tiny_tokenizer.encode("🦙")  # not in the training corpus: byte-level tokens
    assert len(ids) > 1
    assert streamed(tiny_tokenizer, ids) == [""] * (len(ids) - 1) + ["🦙", ""]


@settings(max_examples=50, deadline=None)
@given(ids=st.lists(st.integers(3, 419), max_size=20))
def test_streamed_deltas_always_concatenate_to_the_full_decode(
    tiny_tokenizer: ChatTokenizer, ids: list[int]
) -> None:
    assert "".join(streamed(tiny_tokenizer, ids)) == tiny_tokenizer.decode(ids)


def test_chat_template_renders_roles_and_the_assistant_opening(
    tiny_tokenizer: ChatTokenizer,
) -> None:
    ids = tiny_tokenizer.encode_chat([{"role": "user", "content": "hello"}])
    text = tiny_tokenizer._backend.decode(ids, skip_special_tokens=False)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert tiny_tokenizer.eos_token_ids == frozenset({2})


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_streamed_deltas_never_split_a_character(
    smol_tokenizer: ChatTokenizer, text: str
) -> None:
    deltas = streamed(smol_tokenizer, smol_tokenizer.encode(text))
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
