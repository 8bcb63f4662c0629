from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infercache.errors import ConfigError
from infercache.tokenizing.chat_frames import turns_of
from infercache.tokenizing.tokenizers import (
    Chars4Tokenizer,
    PromptTokenizer,
    TemplateTokenizer,
    load_tokenizer,
)
from tests.analyze.generators import SUPPORT_SYSTEM, multi_turn_chat, support_bot

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A template that rewrites contents: frames must notice and fall back to full rendering.
TRIMMING = CHATML.replace("message['content']", "(message['content'] | trim)")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "You are a helpful assistant. Answer briefly.",
    "How do I reset my password? Where are my invoices?",
    "Naïve café déjà vu: 東京 is Tokyo, 😀 is a smile.",
    "system user assistant question answer hello world",
]
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hello world"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "\n\n  leading whitespace and a <|im_end|> inside"},
        {"role": "assistant", "content": "Naïve café 😀"},
        {"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "image_url"}]},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "How do I reset my password?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
        {"role": "tool", "content": "done"},
    ],
]


def write_tokenizer(directory: Path, template: str) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "chat_template.jinja").write_text(template)
    return directory


def direct_encoding(
    tokenizer: TemplateTokenizer, messages: list[dict[str, Any]]
) -> tuple[int, ...]:
    """The slow, obvious way: render with the template, encode the whole text."""
    from transformers.utils.chat_template_utils import render_jinja_template

    turns = [{"role": r, "content": t} for r, t in turns_of(messages)]
    rendered: Any = render_jinja_template(
        [turns], chat_template=tokenizer.renderer.template, add_generation_prompt=True
    )
    text = rendered if isinstance(rendered, str) else rendered[0][0]
    return tuple(tokenizer.hf.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("template", [CHATML, TRIMMING], ids=["chatml", "trimming"])
def test_template_tokenizer_equals_rendering_then_encoding(tmp_path: Path, template: str) -> None:
    tokenizer = TemplateTokenizer.from_dir(write_tokenizer(tmp_path / "tok", template))
    # The same role sequence first with plain, then with padded contents: a frame built on
    # the first must not be trusted for the second when the template trims.
    padded = [{"role": "user", "content": "  hello world \n"}]
    for messages in [*CONVERSATIONS, padded] * 2:  # the second pass is served by the caches
        assert tokenizer.encode_messages(messages) == direct_encoding(tokenizer, messages)


def test_chars4_counts_four_bytes_a_token_and_one_per_marker() -> None:
    tokenizer = Chars4Tokenizer()
    ids = tokenizer.encode_messages([{"role": "user", "content": "abcdefgh"}])
    # <|im_start|> "user\nabcdefgh" (13 bytes: 4) <|im_end|> "\n" <|im_start|> "assistant\n" (3)
    assert len(ids) == 1 + 4 + 1 + 1 + 1 + 3
    assert tokenizer.count("déjà") == 2  # 6 bytes of UTF-8
    assert tokenizer.count("") == 0


@pytest.mark.parametrize(
    "tokenizer_name", ["chars4", pytest.param("smollm2", marks=pytest.mark.slow)]
)
def test_each_turn_of_a_conversation_extends_the_previous_request(
    tokenizer_name: str, request: pytest.FixtureRequest
) -> None:
    tokenizer: PromptTokenizer = (
        Chars4Tokenizer() if tokenizer_name == "chars4" else request.getfixturevalue("smollm2")
    )
    chat = multi_turn_chat(seed=3, conversations=5)
    ids = [tokenizer.encode_messages(r["request"]["messages"]) for r in chat.records]
    for i, previous in enumerate(chat.truth.previous_turn):
        if previous is None:
            continue
        before, now = ids[previous], ids[i]
        # chars4 may lose the previous prompt's final partial 4-byte piece, never more
        slack = 1 if tokenizer_name == "chars4" else 0
        assert now[: len(before) - slack] == before[: len(before) - slack]
        assert len(now) > len(before)


@pytest.mark.slow
def test_packaged_smollm2_tokenizer_equals_rendering_then_encoding(
    smollm2: PromptTokenizer,
) -> None:
    assert isinstance(smollm2, TemplateTokenizer)
    records = support_bot(seed=1, n=30).records + multi_turn_chat(seed=1, conversations=4).records
    for messages in [r["request"]["messages"] for r in records] + CONVERSATIONS:
        assert smollm2.encode_messages(messages) == direct_encoding(smollm2, messages)
    assert 300 < smollm2.count(SUPPORT_SYSTEM) < 450


def test_an_unknown_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--tokenizer 'nonsense'"):
        load_tokenizer("nonsense", tmp_path)


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TemplateTokenizer:
    return TemplateTokenizer.from_dir(write_tokenizer(tmp_path_factory.mktemp("w") / "tok", CHATML))


@given(text=st.text(alphabet=st.sampled_from(list("ab c\n\t'sé東😀1.,!")), max_size=60))
@settings(max_examples=200, deadline=None)
def test_byte_level_bpe_word_by_word_equals_the_library(
    word_tokenizer: TemplateTokenizer, text: str
) -> None:
    words = word_tokenizer._words
    assert words is not None  # a plain byte-level BPE: the word path is taken
    expected = tuple(word_tokenizer.hf.encode(text, add_special_tokens=False).ids)
    assert words.encode(text) == expected


@pytest.mark.slow
def test_the_packaged_tokenizer_takes_the_word_path(smollm2: PromptTokenizer) -> None:
    assert isinstance(smollm2, TemplateTokenizer)
    words = smollm2._words
    assert words is not None
    for text in [SUPPORT_SYSTEM, "  leading\n\n\ttabs  and 1,234.5 numbers — naïve 東京 😀 it's"]:
        assert words.encode(text) == tuple(smollm2.hf.encode(text, add_special_tokens=False).ids)
