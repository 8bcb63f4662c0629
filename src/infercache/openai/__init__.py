"""The wrapped official `openai` client: its chat completions and embeddings cached in process.

client.py        `wrap(client, cache)`: the SDK's own client, its HTTP client swapped for a
                 caching one
http_path.py     the path one HTTP request of it takes: hits answered, misses fetched once
                 through the one miss protocol (miss_flight.py), streams included
send_source.py   the wrapped client's own `send` as the protocol's Source
sse_streams.py   SSE both ways: an upstream's bytes → chunks (and the answer they add up
                 to), a flight's chunks → the bytes a client reads
"""
