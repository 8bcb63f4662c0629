"""A log record prepared once for every consumer (census, breakers, replays): a `PreparedRequest`.

Per record kind (log_reader.py):
- a request (`body`, `record`): parsed and validated by `request.parse_request` (a body the
  cache would refuse is a malformed line), keyed by `keys.exact_key` exactly as the cache keys
  it, tokenised through the chat template (tokenizing/), scoped by `semantic.scope.query_of`
  when near-duplicates are measured, and checked against the cache policy.
- `redacted` (redaction.py): the exact identity is the key digest (an HMAC of the exact key,
  so repeats count exactly as on the plain log); the units are the chained prefix hashes, each
  standing for its chunk's tokens. For the replay, a stand-in body carries the digest as its
  only message, so the real cache serves exactly the requests the digest repeats (keeping the
  logged reason a request was not cacheable). An older redacted line has only a digest of the
  whole body (`request_digest`, stricter than the key: repeats are a lower bound) and no
  prefix hashes.
- `blocks`: the exact identity is (input_length, hash_ids); the units are the block hashes.

Not cacheable: `policy.not_cacheable_reason`, the phrase the redacted request log records too.

Timings: `upstream_s` is a measured upstream call: the log's `upstream_ms`, else its
`latency_ms` when the live layer went upstream (`miss`, `bypass`, `uncacheable`); `timing`
adds the time to first token and the token counts the cost model fits rates on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NamedTuple

from infercache.analyze.cost_model import Timing
from infercache.analyze.log_reader import LineErrors, LineFormat, LogRecord
from infercache.analyze.simulated_prefix_cache import TokensPerUnit
from infercache.errors import InvalidRequestError
from infercache.keys import IGNORABLE_FIELDS, KEY_PREFIX, canonical_json, exact_key
from infercache.policy import (
    NO_STORE,
    SAMPLED,
    SIDE_EFFECTS,
    CachePolicy,
    not_cacheable_reason,
    usage_tokens,
)
from infercache.request import ChatRequest, parse_request
from infercache.semantic.scope import Query, query_of
from infercache.tokenizing.chat_frames import Turn, turns_of
from infercache.tokenizing.tokenizers import PromptTokenizer
from infercache.versions import UNVERSIONED, VersionView

UPSTREAM_LAYERS = frozenset({"miss", "bypass", "uncacheable"})  # logged lines that went upstream


class PreparedRequest(NamedTuple):  # a NamedTuple: one per request, cheaper than frozen
    where: str  # file:line
    kind: LineFormat
    timestamp_s: float | None
    tenant: str
    model: str
    exact_id: bytes  # 16 bytes: equal ids = exact repeat
    units: tuple[int, ...] | None  # token ids, or block hashes; None when unknown
    unit_tokens: TokensPerUnit  # 1 for token ids, the block size, or each hash's chunk size
    prompt_tokens: int | None
    completion_tokens: int | None
    not_cacheable: str | None  # why the exact cache would not serve it
    body: dict[str, Any] | None = None  # the request as sent (or a stand-in), for the replay
    tenant_override: str | None = None  # the logged (authenticated) tenant
    response: dict[str, Any] | None = None
    upstream_s: float | None = None  # a measured upstream call, when the log has one
    query: Query | None = None  # semantic scope and text
    first_message: tuple[str, str] | None = None  # (role, text), for prefix breakers
    layer: str | None = None  # what the gateway did live
    turns: tuple[Turn, ...] | None = None  # (role, text) to tokenise, while `units` is None
    timing: Timing | None = None  # for the cost model's fit
    tenant_name: str | None = None  # the tenant's configured name, when logged
    hashed_by: str | None = None  # redacted: the tokenizer behind the prefix hashes


def stand_in_body(digest: str, model: str, not_cacheable: str | None) -> dict[str, Any]:
    """A body the cache keys on `digest` alone, refused for the same reason as the original."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": digest}],
        "temperature": 0,
    }
    if not_cacheable == SAMPLED:
        body["temperature"] = 1.0
    elif not_cacheable == NO_STORE:
        body["infercache"] = {"cache_control": ["no-store"]}
    elif not_cacheable == SIDE_EFFECTS:
        tool = {"type": "function", "function": {"name": "act", "parameters": {}}}
        body["tools"] = [{**tool, "x-side-effects": True}]
    return body


def _digest16(*parts: object) -> bytes:
    return hashlib.sha256(canonical_json(list(parts))).digest()[:16]


def tokenized(event: PreparedRequest, tokenizer: Callable[[], PromptTokenizer]) -> PreparedRequest:
    """`event` with its prompt's token ids, when it still carries `turns` to tokenise."""
    if event.turns is None:
        return event
    units = tokenizer().encode_turns(event.turns)
    return event._replace(units=units, prompt_tokens=len(units), turns=None)


def _measured_upstream_s(record: LogRecord) -> float | None:
    if record.upstream_s is not None:
        return record.upstream_s
    if record.latency_s is not None and record.layer in UPSTREAM_LAYERS:
        return record.latency_s
    return None


def _timing(record: LogRecord, completion: int | None) -> Timing | None:
    upstream_s = _measured_upstream_s(record)
    if upstream_s is None or record.prompt_tokens is None or completion is None:
        return None
    uncached = max(0, record.prompt_tokens - (record.cached_tokens or 0))
    return Timing(upstream_s, record.ttft_s, uncached, completion)


@dataclass(eq=False, repr=False, slots=True)
class RequestPreparer:
    """Record → PreparedRequest. The tokenizer is built on the first request that needs one (a
    block trace never loads it). Records it cannot use are added to `errors` and dropped.
    With `tokenize=False` a request carries its `turns` instead of `units`, for `tokenize` to
    finish elsewhere (reader_process.py tokenises in the process that classifies)."""

    make_tokenizer: Callable[[], PromptTokenizer]
    policy: CachePolicy
    errors: LineErrors
    _: KW_ONLY
    block_tokens: int
    with_queries: bool
    ignorable_fields: frozenset[str] = IGNORABLE_FIELDS
    tokenize: bool = True
    _tokenizer: PromptTokenizer | None = field(init=False, default=None)

    @property
    def tokenizer(self) -> PromptTokenizer:
        if self._tokenizer is None:
            self._tokenizer = self.make_tokenizer()
        return self._tokenizer

    def prepare(self, record: LogRecord) -> PreparedRequest | None:
        if record.kind is LineFormat.BLOCKS:
            return self._blocks(record)
        if record.kind is LineFormat.REDACTED:
            return self._redacted(record)
        try:
            return self._request(record)
        except InvalidRequestError as exc:
            self.errors.add(record.source, record.line, f"invalid request: {exc.message}")
            return None

    def _blocks(self, record: LogRecord) -> PreparedRequest:
        assert record.hash_ids is not None
        assert record.prompt_tokens is not None
        return PreparedRequest(
            record.where,
            record.kind,
            record.timestamp_s,
            tenant=record.tenant or "",
            model=record.model or "",
            exact_id=_digest16("blocks", record.prompt_tokens, record.hash_ids),
            units=record.hash_ids,
            unit_tokens=self.block_tokens,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            not_cacheable=None,
        )

    def _redacted(self, record: LogRecord) -> PreparedRequest:
        assert record.digest is not None
        tenant, model = record.tenant or "", record.model or ""
        sizes = record.hash_chunk_tokens
        prompt = sum(sizes) if sizes is not None else record.prompt_tokens
        return PreparedRequest(
            record.where,
            record.kind,
            record.timestamp_s,
            tenant=tenant,
            model=model,
            exact_id=_digest16("redacted", tenant, record.digest),
            units=record.hash_ids,
            unit_tokens=sizes if sizes is not None else 1,
            prompt_tokens=prompt,
            completion_tokens=record.completion_tokens,
            not_cacheable=record.not_cacheable,
            body=stand_in_body(record.digest, model, record.not_cacheable),
            tenant_override=tenant,
            upstream_s=_measured_upstream_s(record),
            layer=record.layer,
            timing=_timing(record, record.completion_tokens),
            tenant_name=record.tenant_name,
            hashed_by=record.prefix_tokenizer,
        )

    def _request(self, record: LogRecord) -> PreparedRequest:
        assert record.request is not None
        request = parse_request(record.request, tenant=record.tenant)
        key = exact_key(request, self.ignorable_fields)
        turns = tuple(turns_of(request.body["messages"]))
        units = self.tokenizer.encode_turns(turns) if self.tokenize else None
        completion = (
            usage_tokens(record.response)[1] if record.response else record.completion_tokens
        )
        return PreparedRequest(
            record.where,
            record.kind,
            record.timestamp_s,
            tenant=request.directives.tenant,
            model=request.model,
            exact_id=bytes.fromhex(key[len(KEY_PREFIX) :][:32]),
            units=units,
            unit_tokens=1,
            prompt_tokens=None if units is None else len(units),
            completion_tokens=completion,
            not_cacheable=not_cacheable_reason(request, self.policy),
            body=record.request,
            tenant_override=record.tenant,
            response=record.response,
            upstream_s=_measured_upstream_s(record),
            query=self._query(request) if self.with_queries else None,
            first_message=turns[0],
            layer=record.layer,
            turns=None if units is not None else turns,
            timing=_timing(record, completion),
            tenant_name=record.tenant_name,
        )

    def _query(self, request: ChatRequest) -> Query | None:
        view = VersionView(UNVERSIONED, tuple((t, 0) for t in request.directives.tags))
        return query_of(request, view, self.ignorable_fields)
