"""`LangChainCache`: LangChain's LLM cache (`langchain_core.caches.BaseCache`, sync and async) on
infercache's exact layer. Install with `pip install 'infercache[langchain]'`.

    from langchain_core.globals import set_llm_cache
    set_llm_cache(LangChainCache(Cache(Settings.load()), tenant="acme"))

LangChain asks `lookup(prompt, llm_string)` before calling a model and `update(prompt,
llm_string, generations)` after. Each pair becomes a chat request for the exact layer:

    {"model": <the model named in llm_string>, "messages": [{"role": "user", "content": prompt}],
     "llm_string": llm_string, "infercache": {"tenant": tenant, "tags": [namespace tag, *tags]}}

so the key covers the tenant, the prompt and every parameter LangChain serialised into
`llm_string` (exact.py, keys.py), and everything the exact layer does holds: TTLs, the model
version (`cache.set_model_version(model, v)` retires the model's answers), tag invalidation, a
failing store being a counted miss. The model is read from `llm_string` (`model`, `model_name`
or `model_id` of a serialisable model, else its `_type`; "langchain" when neither is there).

The generations are stored beside an OpenAI-shaped answer (the exact layer stores only complete
answers: one choice per generation, finish_reason "stop", usage from the messages'
`usage_metadata`), serialised with LangChain's own message dicts, not `langchain_core.load`
(whose `loads` is a beta API that warns).

The view of versions and tags seen by a missed `lookup` is remembered (bounded) until its
`update`, so an answer generated across a model swap or an invalidation is stored under the old
state and never served, and the time between them is recorded as the upstream time saved by
later hits. `clear()` invalidates the namespace tag: O(1), and only this cache's entries.
Thread-safe; the async methods run the store I/O in a thread.
"""

from __future__ import annotations

import ast
import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from langchain_core.caches import RETURN_VAL_TYPE, BaseCache
    from langchain_core.messages import message_to_dict, messages_from_dict
    from langchain_core.outputs import (
        ChatGeneration,
        ChatGenerationChunk,
        Generation,
        GenerationChunk,
    )
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "infercache.integrations.langchain needs langchain-core: "
        "pip install 'infercache[langchain]'"
    ) from exc

import orjson

from infercache.cache import Cache
from infercache.exact import Lookup
from infercache.metrics import MissReason
from infercache.request import ChatRequest, parse_request
from infercache.versions import VersionView

_GENERATION_KINDS: dict[str, type[Generation]] = {
    cls.__name__: cls for cls in (Generation, GenerationChunk, ChatGeneration, ChatGenerationChunk)
}
_PENDING_MAX = 1024  # missed lookups remembered until their update


def model_from_llm_string(llm_string: str) -> str:
    """The model LangChain's `llm_string` names, for model versions and prices."""
    params: Mapping[str, Any] = {}
    try:  # a serialisable model: its JSON, then "---" and its call parameters
        serialized, end = json.JSONDecoder().raw_decode(llm_string)
        if isinstance(serialized, dict) and llm_string[end:].startswith("---"):
            kwargs = serialized.get("kwargs")
            params = kwargs if isinstance(kwargs, dict) else {}
    except ValueError:
        try:  # any other model: repr(sorted(params.items()))
            items = ast.literal_eval(llm_string)
            params = dict(items) if isinstance(items, list) else {}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            params = {}
    for name in ("model", "model_name", "model_id", "_type"):
        value = params.get(name)
        if isinstance(value, str) and value:
            return value
    return "langchain"


def _dump_generation(generation: Generation) -> dict[str, Any]:
    kind = type(generation).__name__
    if kind not in _GENERATION_KINDS:  # a subclass we do not know: keep its base
        kind = "ChatGeneration" if isinstance(generation, ChatGeneration) else "Generation"
    out: dict[str, Any] = {"kind": kind, "generation_info": generation.generation_info}
    if isinstance(generation, ChatGeneration):
        out["message"] = message_to_dict(generation.message)
    else:
        out["text"] = generation.text
    return out


def _load_generation(stored: Mapping[str, Any]) -> Generation:
    cls = _GENERATION_KINDS[stored["kind"]]
    info = stored.get("generation_info")
    if issubclass(cls, ChatGeneration):
        (message,) = messages_from_dict([stored["message"]])
        return cls(message=message, generation_info=info)
    return cls(text=stored["text"], generation_info=info)


def _usage(generations: Sequence[Generation]) -> dict[str, int]:
    prompt_tokens = completion_tokens = 0
    for generation in generations:
        usage = getattr(getattr(generation, "message", None), "usage_metadata", None) or {}
        prompt_tokens = max(prompt_tokens, int(usage.get("input_tokens", 0)))
        completion_tokens += int(usage.get("output_tokens", 0))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class LangChainCache(BaseCache):
    """LangChain's LLM cache on `cache`'s exact layer. `tenant` scopes every entry; `tags`
    (with the namespace's own tag) let `cache.invalidate` retire them; `namespace` separates
    caches sharing one store (its tag is `langchain:<namespace>`)."""

    def __init__(
        self,
        cache: Cache,
        *,
        tenant: str = "",
        tags: Sequence[str] = (),
        namespace: str = "default",
    ) -> None:
        self.cache = cache
        self.tenant = tenant
        self.namespace_tag = f"langchain:{namespace}"
        self.tags = sorted({self.namespace_tag, *tags})
        self._metrics = cache.metrics.strategy("exact")
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, tuple[VersionView | None, float]] = OrderedDict()

    def _request(self, prompt: str, llm_string: str) -> ChatRequest:
        body = {
            "model": model_from_llm_string(llm_string),
            "messages": [{"role": "user", "content": prompt}],
            "llm_string": llm_string,
            "infercache": {"tenant": self.tenant, "tags": self.tags},
        }
        return parse_request(body)

    def lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        request = self._request(prompt, llm_string)
        lookup = self.cache.exact.lookup(request)
        entry = lookup.entry
        if entry is None:
            self._metrics.miss(lookup.miss_reason or MissReason.ABSENT)
            self._remember(lookup)
            return None
        self._metrics.prompt_tokens(entry.prompt_tokens)
        self._metrics.hit(
            prompt_tokens=entry.prompt_tokens,
            completion_tokens=entry.completion_tokens,
            upstream_s=entry.upstream_s,
            money_usd=self.cache.metrics.prices.cost_usd(
                entry.model, entry.prompt_tokens, entry.completion_tokens
            ),
        )
        stored = orjson.loads(entry.response)
        return [_load_generation(g) for g in stored["langchain_generations"]]

    def update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        request = self._request(prompt, llm_string)
        lookup, upstream_s = self._recall(request)
        response = {
            "object": "chat.completion",
            "model": request.model,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": g.text},
                    "finish_reason": "stop",
                }
                for i, g in enumerate(return_val)
            ],
            "usage": _usage(return_val),
            "langchain_generations": [_dump_generation(g) for g in return_val],
        }
        self.cache.exact.store(lookup, request, response, upstream_s=upstream_s)

    def clear(self, **kwargs: Any) -> None:
        """Make every entry of this namespace unreachable (other entries are kept)."""
        self.cache.invalidate([self.namespace_tag])

    # The async methods run where store_guard.py's StoreIO says: on the loop when the store
    # cannot make them wait, else off it.

    async def alookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        return await self.cache.store_io.read(self.lookup, prompt, llm_string)

    async def aupdate(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        failed = functools.partial(self.cache.exact.store_failed, "store")
        await self.cache.store_io.write(self.update, prompt, llm_string, return_val, failed=failed)

    async def aclear(self, **kwargs: Any) -> None:
        await self.cache.store_io.off_loop(self.clear, **kwargs)

    # -- the view a missed lookup saw, kept until its update --

    def _remember(self, lookup: Lookup) -> None:
        with self._lock:
            self._pending[lookup.key] = (lookup.view, self.cache.clock.monotonic_s())
            self._pending.move_to_end(lookup.key)
            while len(self._pending) > _PENDING_MAX:
                self._pending.popitem(last=False)

    def _recall(self, request: ChatRequest) -> tuple[Lookup, float]:
        """The lookup to store under: the view its missed lookup saw, and the time since."""
        key = self.cache.exact.key(request)
        with self._lock:
            seen = self._pending.pop(key, None)
        if seen is None:  # an update without a lookup: store under the current state
            return self.cache.exact.lookup(request, read_entry=False), 0.0
        view, started_s = seen
        upstream_s = self.cache.clock.monotonic_s() - started_s
        return Lookup(key, view, None, MissReason.ABSENT), upstream_s
