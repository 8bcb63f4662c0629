"""The KV namespace rule: which requests may reuse each other's attention state.

One answer, asked by every part that keys KV: the engine's radix tree (engine/openai_api.py),
its disk and shared tiers (the namespace is hashed into every block's name, kv_blocks.py), and
the analyzer's simulated prefix cache (analyze/census.py, analyze/replay.py), so what the
analyzer predicts is what the engine does.

A namespace is one model's KV of one tenant, or of everybody when sharing across tenants is
configured, split again by the request's `cache_salt` (vLLM's extension: equal prompts with
different salts never share KV). Requests without a tenant share one anonymous namespace. It
is JSON of a fixed-length list, so no tenant name, model id or salt can be chosen to spell
another's namespace.

Pure: no I/O, no heavy imports (the analyzer imports it without torch).
"""

from __future__ import annotations

import json


def kv_namespace(
    tenant: str | None,
    *,
    model: str,
    cache_salt: str | None = None,
    share_across_tenants: bool = False,
) -> str:
    """The namespace of a request of `tenant` (None or "": anonymous) to `model`."""
    scope = None if share_across_tenants else (tenant or "")
    kind = "shared" if share_across_tenants else "tenant"
    return json.dumps([kind, scope, model, cache_salt], ensure_ascii=False)


def logged_namespace(tenant: str, model: str, body: object, *, share_across_tenants: bool) -> str:
    """The namespace of a logged request: its `body`'s `cache_salt` when it carries a usable
    one (the engine refuses any other with a 400, so that request never reached the KV)."""
    salt = body.get("cache_salt") if isinstance(body, dict) else None
    return kv_namespace(
        tenant,
        model=model,
        cache_salt=salt if isinstance(salt, str) and salt else None,
        share_across_tenants=share_across_tenants,
    )
