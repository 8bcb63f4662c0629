"""What a Responses follow-up (`previous_response_id`) continues: the conversation of every
answer this gateway served, kept per tenant in the cache's store with a TTL. The one module of
responses/ that does I/O, through the store it is given.

    keep(request, response)        after an answer was fetched (the endpoint's `observe`: store
                                   I/O, run with the store write): the request's whole input
                                   and the answer's output (request.conversation_after), under
                                   "rsc1:" + sha256(tenant, response id), living as long as
                                   the request's answer would (policy.ttl_s)
    earlier(tenant, response_id)   the items a follow-up continues from; None when this gateway
                                   did not serve that id to this tenant, or it expired

A tenant never reaches another's conversation: the tenant is hashed into the key, and a lookup
is made with the caller's resolved tenant only. A request that asked the provider not to keep
it (`store: false`) is not kept either. A hit is not kept again: the answer it replays was kept
when it was fetched, under the same tenant and the same content (its exact key holds both).
A store failure raises `StoreError`; the caller counts it and goes on without the conversation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from infercache.clock import Clock
from infercache.policy import CachePolicy
from infercache.request import ChatRequest
from infercache.responses.request import conversation_after
from infercache.stores.base import Backend, Entry

CONVERSATION_PREFIX = "rsc1:"


def conversation_key(tenant: str, response_id: str) -> str:
    digest = hashlib.sha256(f"{tenant}\x00{response_id}".encode()).hexdigest()
    return CONVERSATION_PREFIX + digest


class ResponseConversations:
    def __init__(self, backend: Backend, clock: Clock, policy: CachePolicy) -> None:
        self._backend = backend
        self._clock = clock
        self._policy = policy

    def keep(self, request: ChatRequest, response: Mapping[str, Any]) -> None:
        """Keep the conversation `response` ends (raises StoreError)."""
        response_id = response.get("id")
        if not isinstance(response_id, str) or request.body.get("store") is False:
            return
        items = conversation_after(request.body, response)
        now_s = self._clock.now_s()
        entry = Entry(
            response=orjson.dumps(items),
            model=str(request.body.get("model", "")),
            model_version="",
            tags=(),
            created_at_s=now_s,
            expires_at_s=now_s + self._policy.ttl_s(request),
            upstream_s=0.0,
            prompt_tokens=0,
            completion_tokens=0,
        )
        self._backend.put(conversation_key(request.directives.tenant, response_id), entry)

    def earlier(self, tenant: str, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation `response_id` ended for `tenant` (raises StoreError)."""
        entry = self._backend.get(conversation_key(tenant, response_id))
        if entry is None or entry.expires_at_s <= self._clock.now_s():
            return None
        items = orjson.loads(entry.response)
        return items if isinstance(items, list) else None
