"""Redacted request-log records: what the traffic analyzer needs from a request, without its text.

A deployment keeps one secret: 32 random bytes in `<data dir>/redaction.key`, created once
with mode 0600 and read on every later start (`load_or_create_secret`). Every digest below is
an HMAC-SHA256 under it, so digests from two deployments never match, and nobody without the
secret can test a digest against a guessed prompt.

`redact_request(body, tenant=, exact_key=, secret=, tokenizer=, policy=)` gives the fields of
one redacted record (the gateway's request log adds the token counts, timings and layer it
already writes):

    redaction            REDACTION_VERSION
    key_digest           "hmac-sha256:" + 32 hex digits of HMAC(secret, "exact\\0" + exact key):
                         equal digests ⇔ equal exact-cache keys, so exact repeats count as on a
                         plain log
    prefix_hashes        the prompt's chained prefix hashes (below), 63-bit integers
    prefix_chunk_tokens  the token count of each hashed chunk
    prefix_tokenizer     the tokenizer's name;  prefix_block_tokens: the block size
    not_cacheable        why the exact cache would not serve the request (a fixed phrase), or null

Prefix hashes, like the `hash_ids` of Mooncake's traces: the prompt is rendered with its chat
template and tokenized (`PromptTokenizer.encode_turns`, the packaged SmolLM2 tokenizer by
default: `load_tokenizer("smollm2", data_dir)`; `chars4` without the engine extra), and the
token ids are cut into chunks after every boundary token (a special token such as a
template's turn markers, or a token holding a newline) and after every `block_tokens` (4)
tokens since the last cut. Chunk i is named together with everything before it:

    h_0 = HMAC(secret, "prefix\0" + tenant)        h_i = HMAC(secret, h_(i-1) ‖ ids of chunk i)

so two prompts of one tenant share their leading hashes exactly as far as they share whole
chunks, and never across tenants. Cutting at boundaries makes a prefix shared up to a message
or a line (a system prompt, an earlier turn) match to the token; what is lost is the shared
part of the one chunk where two prompts diverge: fewer than `block_tokens` tokens a request.
With 4-token blocks the prefix share of every generated day in the tests stays within half a
point of the plain log's (bench/README.md, "Analyzer"), for ~5 bytes of log per prompt token.

`Redactor` is what the gateway's request log holds (`serve --redact`): the secret, the
tokenizer and the cache policy of one deployment, built once at start (`Redactor.of(settings)`),
plus a memo of the hash chain. Most of a request's cost is the HMAC per chunk (~60 for a
150-token system prompt and a short question); the chunks a tenant's requests share (its
system prompt, a repeated question) chain to the same states, so each step is looked up by
(state, chunk) first, in a two-generation dict of at most `memo_steps` steps. A step costs a
dict lookup instead of an HMAC; the first request through a prefix pays the HMACs. Measured on
a support-bot mix: bench/README.md, "Analyzer". A `Redactor` is thread-safe (one lock).

Pure: no I/O except the secret file; `random_bytes` is injected (os.urandom by default).
"""

from __future__ import annotations

import hmac
import os
import stat
import threading
from array import array
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from pathlib import Path
from typing import Any

from infercache.errors import ConfigError, InvalidRequestError
from infercache.extras import available
from infercache.keys import IGNORABLE_FIELDS
from infercache.keys import exact_key as key_of
from infercache.policy import CachePolicy, not_cacheable_reason
from infercache.request import parse_request
from infercache.settings import Settings
from infercache.tokenizing.chat_frames import turns_of
from infercache.tokenizing.tokenizers import PromptTokenizer, load_tokenizer

REDACTION_VERSION = 1
SECRET_FILE = "redaction.key"
SECRET_BYTES = 32
DEFAULT_BLOCK_TOKENS = 4
KEY_DIGEST_PREFIX = "hmac-sha256:"
_HASH_BITS = 63  # below 2**63: a JSON integer every reader takes, few collisions per log


def load_or_create_secret(
    data_dir: Path, *, random_bytes: Callable[[int], bytes] = os.urandom
) -> bytes:
    """The deployment's secret: read `data_dir/redaction.key`, or create it once (mode 0600).
    Two processes starting together agree: the file appears whole or not at all (written
    aside, then hard-linked into place; the loser of the race reads the winner's)."""
    path = data_dir / SECRET_FILE
    if not path.exists():
        _create(path, random_bytes(SECRET_BYTES))
    try:
        mode = path.stat().st_mode
        secret = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the redaction secret {path}: {exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"the redaction secret {path} is readable by others: chmod 600 it")
    if len(secret) != SECRET_BYTES:
        raise ConfigError(
            f"the redaction secret {path} holds {len(secret)} bytes, not {SECRET_BYTES}"
        )
    return secret


def _create(path: Path, secret: bytes) -> None:
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a secret is {SECRET_BYTES} bytes, got {len(secret)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, secret)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(aside, path)
        except FileExistsError:
            pass  # another process created it first: use theirs
        finally:
            aside.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot create the redaction secret {path}: {exc}") from exc


def key_digest(secret: bytes, exact_key: str) -> str:
    """The exact-cache key as the redacted log writes it."""
    mac = hmac.digest(secret, b"exact\x00" + exact_key.encode(), "sha256")
    return KEY_DIGEST_PREFIX + mac[:16].hex()


def chunks(
    token_ids: Sequence[int], boundary_ids: Container[int], block_tokens: int
) -> Iterator[Sequence[int]]:
    """The token ids cut after every special token and every `block_tokens` since a cut."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    start = 0
    for i, token in enumerate(token_ids):
        if token in boundary_ids or i + 1 - start == block_tokens:
            yield token_ids[start : i + 1]
            start = i + 1
    if start < len(token_ids):
        yield token_ids[start:]


class ChainMemo:
    """Chain steps already computed: (state, chunk ids) → next state, in two generations of at
    most `max_steps / 2` steps each (a step found in the old one moves back). Not thread-safe."""

    def __init__(self, max_steps: int = 1 << 16) -> None:
        self._half = max(1, max_steps // 2)
        self._new: dict[bytes, bytes] = {}
        self._old: dict[bytes, bytes] = {}

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def step(self, secret: bytes, state: bytes, chunk: bytes) -> bytes:
        key = state + chunk
        found = self._new.get(key)
        if found is not None:
            return found
        found = self._old.pop(key, None)
        if found is None:
            found = hmac.digest(secret, key, "sha256")
        if len(self._new) >= self._half:
            self._old, self._new = self._new, {}
        self._new[key] = found
        return found


def prefix_hashes(
    secret: bytes,
    tenant: str,
    token_ids: Sequence[int],
    *,
    boundary_ids: Container[int],
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    memo: ChainMemo | None = None,
) -> tuple[list[int], list[int]]:
    """(chained hash of each chunk, tokens of each chunk); see the module docstring. With a
    `memo`, steps it holds are not recomputed (same result)."""
    chain = hmac.digest(secret, b"prefix\x00" + tenant.encode(), "sha256")
    hashes: list[int] = []
    sizes: list[int] = []
    for chunk in chunks(token_ids, boundary_ids, block_tokens):
        data = array("Q", chunk).tobytes()
        if memo is None:
            chain = hmac.digest(secret, chain + data, "sha256")
        else:
            chain = memo.step(secret, chain, data)
        hashes.append(int.from_bytes(chain[:8], "big") >> (64 - _HASH_BITS))
        sizes.append(len(chunk))
    return hashes, sizes


def redact_request(
    body: Mapping[str, Any],
    *,
    tenant: str,
    exact_key: str | None,
    secret: bytes,
    tokenizer: PromptTokenizer,
    policy: CachePolicy,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    ignorable_fields: frozenset[str] = IGNORABLE_FIELDS,
    memo: ChainMemo | None = None,
) -> dict[str, Any]:
    """The redacted fields of one request-log record (see the module docstring).

    `tenant`: the resolved tenant, as the log's `tenant` field; `exact_key`: the exact-cache key
    the request path computed, or None to compute it here (a bypassed request). Raises
    `InvalidRequestError` when `body` is not a request the cache accepts: log such a line
    without these fields."""
    request = parse_request(dict(body), tenant=tenant)
    key = exact_key if exact_key is not None else key_of(request, ignorable_fields)
    ids = tokenizer.encode_turns(turns_of(request.body["messages"]))
    hashes, sizes = prefix_hashes(
        secret,
        tenant,
        ids,
        boundary_ids=tokenizer.boundary_ids,
        block_tokens=block_tokens,
        memo=memo,
    )
    return {
        "redaction": REDACTION_VERSION,
        "key_digest": key_digest(secret, key),
        "prefix_hashes": hashes,
        "prefix_chunk_tokens": sizes,
        "prefix_tokenizer": tokenizer.name,
        "prefix_block_tokens": block_tokens,
        "not_cacheable": not_cacheable_reason(request, policy),
    }


@dataclass(eq=False, repr=False, slots=True)
class Redactor:
    """One deployment's redaction (see the module docstring); thread-safe."""

    secret: bytes
    tokenizer: PromptTokenizer
    policy: CachePolicy
    _: KW_ONLY
    ignorable_fields: frozenset[str] = IGNORABLE_FIELDS
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    memo_steps: InitVar[int] = 1 << 16
    _memo: ChainMemo = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self, memo_steps: int) -> None:
        self._memo = ChainMemo(memo_steps)

    @classmethod
    def of(cls, settings: Settings) -> Redactor:
        """The deployment's: its secret (shared with the upstreams' `cache_salt`), the packaged
        SmolLM2 tokenizer (extracted once into the data dir; `chars4` on an install without
        the engine extra, as the analyzer counts), its cache policy and key fields."""
        tokenizer = "smollm2" if available("engine") else "chars4"
        return cls(
            load_or_create_secret(settings.data_dir),
            load_tokenizer(tokenizer, settings.data_dir),
            settings.policy(),
            ignorable_fields=settings.ignorable_fields,
        )

    def fields(self, body: Mapping[str, Any], tenant: str) -> dict[str, Any]:
        """`redact_request`'s fields for one request; `{"redaction": REDACTION_VERSION}` alone
        for a body the cache does not accept (embeddings, a refused request)."""
        with self._lock:
            try:
                return redact_request(
                    body,
                    tenant=tenant,
                    exact_key=None,
                    secret=self.secret,
                    tokenizer=self.tokenizer,
                    policy=self.policy,
                    block_tokens=self.block_tokens,
                    ignorable_fields=self.ignorable_fields,
                    memo=self._memo,
                )
            except InvalidRequestError:
                return {"redaction": REDACTION_VERSION}
