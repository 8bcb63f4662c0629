"""redaction.py: the deployment secret, the exact-key digest and the chained prefix hashes a
redacted request log carries instead of the text."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from infercache import redaction
from infercache.errors import ConfigError, InvalidRequestError
from infercache.keys import IGNORABLE_FIELDS, exact_key
from infercache.policy import CachePolicy
from infercache.redaction import (
    REDACTION_VERSION,
    SECRET_FILE,
    ChainMemo,
    Redactor,
    chunks,
    key_digest,
    load_or_create_secret,
    prefix_hashes,
    redact_request,
)
from infercache.request import parse_request
from infercache.settings import Settings
from infercache.tokenizing.tokenizers import Chars4Tokenizer

POLICY = CachePolicy(default_ttl_s=3600, max_ttl_s=86_400)
SYSTEM = {"role": "system", "content": "You are the support assistant of Acme. " * 20}


def body(question: str, **extra: object) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [SYSTEM, {"role": "user", "content": question}],
        "temperature": 0,
        **extra,
    }


class CountingRandom:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, n: int) -> bytes:
        self.calls += 1
        return bytes([self.calls]) * n


def test_the_secret_is_created_once_private_and_read_back_after(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    random = CountingRandom()
    first = load_or_create_secret(data_dir, random_bytes=random)
    mode = stat.S_IMODE((data_dir / SECRET_FILE).stat().st_mode)
    assert mode == 0o600
    again = load_or_create_secret(data_dir, random_bytes=random)
    assert first == again == bytes([1]) * 32
    assert random.calls == 1
    assert [p.name for p in data_dir.iterdir()] == [SECRET_FILE]  # no temporary file left


def test_a_secret_others_can_read_or_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / SECRET_FILE
    secret.write_bytes(b"x" * 32)
    os.chmod(secret, 0o644)
    with pytest.raises(ConfigError, match="readable by others: chmod 600"):
        load_or_create_secret(tmp_path)
    os.chmod(secret, 0o600)
    secret.write_bytes(b"short")
    with pytest.raises(ConfigError, match="holds 5 bytes"):
        load_or_create_secret(tmp_path)


def test_equal_keys_give_equal_digests_and_another_secret_other_ones() -> None:
    key = exact_key(parse_request(body("How do I reset my password?"), tenant="acme"))
    other = exact_key(parse_request(body("How do I reset my password?"), tenant="globex"))
    a, b = b"a" * 32, b"b" * 32
    assert key_digest(a, key) == key_digest(a, key)
    assert key_digest(a, key) != key_digest(a, other)
    assert key_digest(a, key) != key_digest(b, key)
    assert key_digest(a, key).startswith("hmac-sha256:")
    assert len(key_digest(a, key)) == len("hmac-sha256:") + 32


def test_chunks_end_at_boundaries_and_at_most_every_block() -> None:
    ids = [1, 2, 9, 3, 4, 5, 6, 7, 9, 8]
    assert [list(c) for c in chunks(ids, {9}, 3)] == [[1, 2, 9], [3, 4, 5], [6, 7, 9], [8]]
    assert [list(c) for c in chunks(ids, set(), 4)] == [[1, 2, 9, 3], [4, 5, 6, 7], [9, 8]]
    with pytest.raises(ValueError, match="block_tokens"):
        list(chunks(ids, set(), 0))


def test_prefix_hashes_share_their_head_exactly_as_far_as_the_prompts_do() -> None:
    tokenizer = Chars4Tokenizer()
    secret = b"s" * 32

    def chain(question: str, tenant: str = "acme", key: bytes = secret) -> list[int]:
        ids = tokenizer.encode_messages(body(question)["messages"])  # type: ignore[arg-type]
        hashes, sizes = prefix_hashes(
            key, tenant, ids, boundary_ids=tokenizer.boundary_ids, block_tokens=4
        )
        assert sum(sizes) == len(ids)
        assert all(0 <= h < 2**63 for h in hashes)
        return hashes

    a, b = chain("How do I reset my password?"), chain("Where are my invoices?")
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    system_tokens = len(tokenizer.encode_messages([SYSTEM]))
    assert shared * 4 >= system_tokens - 4  # the whole system prompt, to the last chunk
    assert chain("How do I reset my password?") == a
    assert chain("How do I reset my password?", tenant="globex")[0] != a[0]  # never across
    assert set(chain("How do I reset my password?", key=b"t" * 32)).isdisjoint(a)


def test_a_redacted_record_carries_no_text_and_the_same_exact_identity() -> None:
    tokenizer = Chars4Tokenizer()
    request = body("How do I reset my password? My email is alice@example.com")
    fields = redact_request(
        request, tenant="acme", exact_key=None, secret=b"s" * 32, tokenizer=tokenizer, policy=POLICY
    )
    assert set(fields) == {
        "redaction",
        "key_digest",
        "prefix_hashes",
        "prefix_chunk_tokens",
        "prefix_tokenizer",
        "prefix_block_tokens",
        "not_cacheable",
    }
    assert "alice" not in repr(fields)
    assert "password" not in repr(fields)
    key = exact_key(parse_request(request, tenant="acme"))
    given = redact_request(
        request, tenant="acme", exact_key=key, secret=b"s" * 32, tokenizer=tokenizer, policy=POLICY
    )
    assert given == fields  # the key the gateway computed, or the one computed here
    assert fields["prefix_tokenizer"] == "chars4"
    assert fields["not_cacheable"] is None
    sampled = redact_request(
        body("hi", temperature=0.7),
        tenant="acme",
        exact_key=None,
        secret=b"s" * 32,
        tokenizer=tokenizer,
        policy=POLICY,
    )
    assert sampled["not_cacheable"] == "sampled without a seed"


def test_a_body_the_cache_refuses_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError):
        redact_request(
            {"model": "m", "messages": []},
            tenant="acme",
            exact_key=None,
            secret=b"s" * 32,
            tokenizer=Chars4Tokenizer(),
            policy=POLICY,
        )


def test_the_chain_memo_gives_the_same_hashes_and_stays_bounded() -> None:
    tokenizer = Chars4Tokenizer()
    secret = b"s" * 32
    memo = ChainMemo(max_steps=64)
    for i in range(40):  # the system prompt again and again, then a new question each time
        ids = tokenizer.encode_messages(body(f"Question {i}: where is my order?")["messages"])  # type: ignore[arg-type]
        plain = prefix_hashes(secret, "acme", ids, boundary_ids=tokenizer.boundary_ids)
        memoised = prefix_hashes(
            secret, "acme", ids, boundary_ids=tokenizer.boundary_ids, memo=memo
        )
        assert memoised == plain
        assert len(memo) <= 64
    other = prefix_hashes(secret, "globex", ids, boundary_ids=tokenizer.boundary_ids, memo=memo)
    assert other == prefix_hashes(secret, "globex", ids, boundary_ids=tokenizer.boundary_ids)


def test_the_deployment_redactor_uses_its_secret_and_marks_a_body_it_cannot_redact(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path, ignorable_fields=IGNORABLE_FIELDS | {"trace_id"})
    redactor = Redactor(
        load_or_create_secret(tmp_path),
        Chars4Tokenizer(),
        settings.policy(),
        ignorable_fields=settings.ignorable_fields,
    )
    fields = redactor.fields(body("Where are my invoices?", trace_id="a"), "acme")
    assert fields == redact_request(
        body("Where are my invoices?", trace_id="b"),  # ignorable in this deployment
        tenant="acme",
        exact_key=None,
        secret=(tmp_path / SECRET_FILE).read_bytes(),
        tokenizer=Chars4Tokenizer(),
        policy=settings.policy(),
        ignorable_fields=settings.ignorable_fields,
    )
    by_default = redactor.fields(body("Where are my invoices?"), "acme")
    assert by_default["key_digest"] == fields["key_digest"]
    assert by_default["prefix_hashes"] == fields["prefix_hashes"]
    assert redactor.fields({"model": "e", "input": ["text"]}, "acme") == {
        "redaction": REDACTION_VERSION
    }


def test_without_the_engine_extra_the_deployment_redactor_counts_with_chars4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redaction, "available", lambda extra: extra != "engine")
    fields = Redactor.of(Settings(data_dir=tmp_path)).fields(body("hi"), "acme")
    assert fields["prefix_tokenizer"] == "chars4"
    assert (tmp_path / SECRET_FILE).is_file()
