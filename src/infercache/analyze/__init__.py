"""The traffic analyzer (`infercache analyze`): let the measurement pick the strategy.

One streaming pass over a day of requests (analysis.py wires it):

    log_reader.py        files → records in time order (JSONL bodies, request records, the
                         gateway's request log, redacted lines, Mooncake block traces; gzip),
                         bad lines counted
    prepared_request.py  record → PreparedRequest: parsed as the cache parses it, exact key,
                         prompt token ids (infercache.tokenizing), semantic scope,
                         cacheability (policy.not_cacheable_reason);
                         reader_process.py runs reading and preparing in a child process
    census.py            each request in one class: exact repeat, near-duplicate
                         (near_duplicates/finder.py), shared prefix (simulated_prefix_cache.py over
                         the engine's radix tree), unique; prefix token share, reuse
                         distances, per tenant and model
    prefix_breakers.py   prompt layouts that defeat prefix reuse (a timestamp up front, ...)
    replay.py            the log through the real `Cache` (exact, semantic) on a manual
                         clock, and the simulated prefix cache under it, alone and layered
                         (replay_store.py: the compact memory store it runs on)
    report_tree.py       the report's figures as a frozen dataclass tree (replay_figures.py:
                         the replay's nodes; report_json.py: the tree as the JSON document
                         `--format json` prints, and back)
    recommend.py         which strategies to turn on, why, and the alarm if hit rates fall,
                         read from the tree (advice.py: advice and alarms; rules.py: the
                         thresholds and the figure formats)
    reports/             document.py (`build_report`: the tree and its recommendation, numbers
                         from replay_numbers.py); text.py, html_page.py, plots.py and
                         alerts.py render it
    cli.py               `infercache analyze`, registered with `register(subparsers)`
    near_duplicates/     the near-duplicate census: finder.py (the layer's accept rule on a
                         sample), scoped_texts.py, word_index.py, ngram_embedder.py,
                         default_matcher.py, embedders.py

Prompt → token ids lives beside the analyzer, not in it (`infercache.tokenizing`): the serving
gateway's redacted request log (redaction.py) tokenises too, and the gateway never stands on
the offline analyzer.
"""
