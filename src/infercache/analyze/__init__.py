"""The traffic analyzer (`infercache analyze`): let the measurement pick the strategy.

One streaming pass over a day of requests (analysis.py wires it):

    logs.py       files → records in time order (JSONL bodies, request records, the gateway's
                  request log, redacted lines, Mooncake block traces; gzip), bad lines counted
    events.py     record → event: parsed as the cache parses it, exact key, prompt token ids
                  (tokenizer.py, frames.py, segments.py), semantic scope, cacheability
    census.py     each request in one class: exact repeat, near-duplicate (neardup.py),
                  shared prefix (prefix.py over the engine's radix tree), unique; prefix token
                  share, reuse distances, per tenant and model
    breakers.py   prompt layouts that defeat prefix reuse (a timestamp up front, ...)
    replay.py     the log through the real `Cache` (exact, semantic) on a manual clock, and
                  the engine's radix accounting under it, alone and layered
    recommend.py  which strategies to turn on, why, and the alarm if hit rates fall
    report.py     the JSON document; text_report.py, html_report.py and plots.py render it
    cli.py        `infercache analyze`, registered with `register(subparsers)`
"""
