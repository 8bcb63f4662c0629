"""The OpenAI-compatible caching gateway: exact (and semantic) layers over any upstream.

One request, from the socket in:

    http_server.py       uvicorn, with a bound on request heads
    app.py               the Starlette app: each path bound to its handler, the lifespan
    routes.py            one handler per route over one small app state: auth, body, tenant
                         (auth.py, the one resolver), header controls (../header_controls.py)
    messages_route.py    `/v1/messages`: Anthropic's API, its errors in Anthropic's shape
    responses_route.py   `/v1/responses`: a follow-up resolved (or passed through)
    feedback.py          `/v1/feedback`: a complaint retires the answer
    service.py           `Gateway`: the request path, top-down — the library's layers
                         (../cache.py), then on a miss the one miss protocol
                         (../miss_flight.py) with:
    endpoints.py           what differs per cached endpoint (chat, completions): an adapter;
                           messages_endpoint.py and responses_endpoint.py the other two
                           (native to their provider, else translated to chat)
    replica_fetch.py       how a miss reaches the upstreams: across_replicas.py (one call per
                           key across gateways), router.py and replica_load.py (the replica,
                           prefix-affine on its load), upstream.py (HTTP) or engine_upstream.py
                           (the engine in process), versions.py (swap detection),
                           prefix_usage.py (the upstream's prefix reuse, priced),
                           live_breakers.py (layouts that defeat it)
    requestlog.py, traffic.py, tracing.py    one record per request: the log line, the
                         `/metrics` series, the span
    stats.py, store_size.py                  `/stats` and the store's size on `/metrics`

Around it: build.py assembles a gateway from settings (config.py, cli.py: `infercache serve`),
forwarding.py says which client headers may go upstream, local_embeddings.py serves
`/v1/embeddings` in process.
"""
