"""The traffic analyzer (`infercache analyze`): let the measurement pick the strategy.

One streaming pass over a day of requests (analysis.py wires it):

    log_reader.py        files → records in time order (JSONL bodies, request records, the
                         gateway's request log, redacted lines, Mooncake block traces; gzip),
                         bad lines counted
    prepared_request.py  record → PreparedRequest: parsed as the cache parses it, exact key,
                         prompt token ids (tokenizing/), semantic scope, cacheability;
                         reader_process.py runs reading and preparing in a child process
    census.py            each request in one class: exact repeat, near-duplicate
                         (near_duplicates/finder.py), shared prefix (simulated_prefix_cache.py over
                         the engine's radix tree), unique; prefix token share, reuse
                         distances, per tenant and model
    prefix_breakers.py   prompt layouts that defeat prefix reuse (a timestamp up front, ...)
    replay.py            the log through the real `Cache` (exact, semantic) on a manual
                         clock, and the simulated prefix cache under it, alone and layered
    recommend.py         which strategies to turn on, why, and the alarm if hit rates fall
    reports/             document.py (the JSON document, numbers from replay_numbers.py);
                         text.py, html_page.py and plots.py render it
    cli.py               `infercache analyze`, registered with `register(subparsers)`

    near_duplicates/     the near-duplicate census: finder.py (the layer's accept rule on a
                         sample), scoped_texts.py, word_index.py, ngram_embedder.py,
                         default_matcher.py, embedders.py
    tokenizing/          tokenizers.py (prompt → token ids, the `PromptTokenizer`s),
                         chat_frames.py (chat templates as literal frames around contents),
                         cached_runs.py (text → ids through caches split at special tokens)
"""
