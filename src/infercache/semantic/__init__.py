"""The semantic layer and its building blocks.

- text → unit vector: `embedder` (the `Embedder` Protocol, MiniLM, static, hashing twin),
  `openai_embedder`;
- nearest cached vectors: `index` (the `VectorIndex` Protocol), `vectors` (shape checks, `Hit`),
  `flat_index`, `hnsw_index`, `growing_index`; `registry` (one index per exact scope);
- deciding: `matcher` (the score a candidate gets: cosine, or a fitted adapter and head),
  `decision` (the one accept rule), `guards`;
- calibrating on labelled data: `pairs`, `calibrate` (pairs), `intents`, `cache_sim`
  (simulated lookups on labelled texts), `fit` (`tune --fit`), `tune` and `cli`
  (`infercache tune`);
- the layer: `scope` (what a match must agree on), `records` (what is persisted), `layer`
  (lookup, store, feedback) with `layer_config`; what it learns from judged answers:
  `outcomes`, with `verify` (live verification, the threshold it keeps), `shadow` (live
  calibration), `answer_stats` (per-answer thresholds) and `judges`; `setup` (building the
  layer from settings).

Nothing here is imported eagerly: torch, transformers, usearch and httpx load only when the
class that needs them is built.
"""
