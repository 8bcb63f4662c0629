"""The wrapped official `openai` client: its chat completions and embeddings cached in process.

client.py        `wrap(client, cache)`: the SDK's own client, its HTTP client swapped for a
                 caching one
http_path.py     the path one HTTP request of it takes: hits answered, misses fetched once
                 through the one miss protocol (miss_flight.py), streams included
sse_recorder.py  an upstream's SSE bytes → chunks, and the answer they add up to
"""
