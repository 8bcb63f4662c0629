"""infercache: a layered cache for LLM inference (exact, semantic, KV-prefix reuse)."""

__version__ = "0.1.0"
