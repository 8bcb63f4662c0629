"""The Anthropic Messages API: the request as the cache keys it (request.py), translation to
and from OpenAI chat for upstreams that speak only chat (translate.py), and the streaming
event sequence both ways (events.py). Pure: nothing here does I/O."""
