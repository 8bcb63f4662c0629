"""A hosted provider's own prompt cache (KV reuse as a service) seen from the gateway: the
usage it reports in each API's shape (usage.py), a derived `prompt_cache_key` for OpenAI-kind
upstreams (cache_key.py), and `cache_control` breakpoints for Anthropic-kind upstreams, placed
only on prefixes already seen (breakpoints.py). Pure: no I/O."""
