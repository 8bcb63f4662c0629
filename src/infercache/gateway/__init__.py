"""The OpenAI-compatible caching gateway: exact (and semantic) layers over any upstream."""
