"""infercache: a layered cache for LLM inference (exact, semantic, KV-prefix reuse).

The names a library user handles, importable from here (and every class of the error tree,
infercache.errors):

    from infercache import Cache, Settings, wrap
    cache = Cache(Settings.load())
    client = wrap(openai.OpenAI(), cache)

Each is imported on first use (PEP 562 `__getattr__`), so `import infercache` stays cheap: it
loads no model library (torch, transformers), no numpy, no openai, and has no side effect.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name → the module that defines it
_EXPORTS = {
    "Cache": "infercache.cache",
    "Completion": "infercache.completion",
    "Layer": "infercache.completion",
    "Settings": "infercache.settings",
    "EmbeddingCache": "infercache.embeddings.embedding_cache",
    "wrap": "infercache.openai.client",
    **dict.fromkeys(
        (
            "InfercacheError",
            "ConfigError",
            "MissingExtraError",
            "InvalidRequestError",
            "ContextTooLongError",
            "PayloadTooLargeError",
            "AuthenticationError",
            "PermissionDeniedError",
            "NotFoundError",
            "ModelNotFoundError",
            "OverloadedError",
            "NotCachedError",
            "StoreError",
            "StoreUnavailableError",
            "EmbedderError",
            "UpstreamError",
            "UpstreamUnavailableError",
            "UpstreamAbortedError",
        ),
        "infercache.errors",
    ),
}

__all__ = [
    "AuthenticationError",
    "Cache",
    "Completion",
    "ConfigError",
    "ContextTooLongError",
    "EmbedderError",
    "EmbeddingCache",
    "InfercacheError",
    "InvalidRequestError",
    "Layer",
    "MissingExtraError",
    "ModelNotFoundError",
    "NotCachedError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Settings",
    "StoreError",
    "StoreUnavailableError",
    "UpstreamAbortedError",
    "UpstreamError",
    "UpstreamUnavailableError",
    "__version__",
    "wrap",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports these
    from infercache.cache import Cache
    from infercache.completion import Completion, Layer
    from infercache.embeddings.embedding_cache import EmbeddingCache
    from infercache.errors import (
        AuthenticationError,
        ConfigError,
        ContextTooLongError,
        EmbedderError,
        InfercacheError,
        InvalidRequestError,
        MissingExtraError,
        ModelNotFoundError,
        NotCachedError,
        NotFoundError,
        OverloadedError,
        PayloadTooLargeError,
        PermissionDeniedError,
        StoreError,
        StoreUnavailableError,
        UpstreamAbortedError,
        UpstreamError,
        UpstreamUnavailableError,
    )
    from infercache.openai.client import wrap
    from infercache.settings import Settings


def __getattr__(name: str) -> Any:
    # Every class of the error tree is reachable here, the ones added later included.
    module = _EXPORTS.get(name) or ("infercache.errors" if name.endswith("Error") else None)
    value = getattr(import_module(module), name, None) if module is not None else None
    if value is None:
        raise AttributeError(f"module 'infercache' has no attribute {name!r}")
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
