"""The semantic layer and its building blocks.

- text → unit vector: `embedder` (the `Embedder` Protocol, MiniLM, static, hashing twin),
  `openai_embedder`;
- nearest cached vectors: `index` (the `VectorIndex` Protocol), `vectors` (shape checks, `Hit`),
  `flat_index`, `hnsw_index`, `growing_index`; `registry` (one index per exact scope);
- the one accept rule shared by tuning and the live cache: `decision`, `guards`;
- calibration on labelled pairs: `pairs`, `calibrate`, and the `infercache tune` command (`cli`);
- the layer itself: `scope` (what a match must agree on), `records` (what is persisted),
  `layer` (lookup and store), `verify` and `judges` (live verification and the threshold it
  keeps), `setup` (building the layer from settings).

Nothing here is imported eagerly: torch, transformers, usearch and httpx load only when the
class that needs them is built.
"""
