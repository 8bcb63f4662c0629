"""The OpenAI Responses API: the request as the cache keys it, a follow-up resolved into the
conversation it continues (request.py), translation to and from chat for chat-only upstreams
(translate.py), and the streaming events both ways (events.py). Pure: nothing here does I/O."""
