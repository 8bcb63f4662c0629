"""The semantic layer and its building blocks.

- text → unit vector: `embedder` (the `Embedder` Protocol, MiniLM, static, hashing twin),
  `openai_embedder`;
- nearest cached vectors: `index` (the `VectorIndex` Protocol), `vectors` (shape checks, `Hit`),
  `flat_index`, `hnsw_index`, `growing_index`; `registry` (one index per exact scope, with how
  many cached questions share each answer);
- deciding: `matcher` (the score a candidate gets: cosine, or a fitted adapter and head),
  `decision` (the one accept rule), `guards` and `content_guards` (a question that says more
  than the other: an appended instruction, a link, a contact detail, a swapped word);
- the layer: `scope` (what a match must agree on), `records` (what is persisted), `layer`
  (lookup and store) with `layer_config` and `lookup_result`, `persistence` (records in the
  store, the replicas' feed), `verification` (verdicts on served and would-be answers); what it
  learns from judged answers: `outcomes`, with `verify` (live verification, the threshold it
  keeps), `shadow` (live calibration), `answer_stats` (per-answer thresholds) and `judges`;
  `from_settings` (the parts from `[semantic]` settings), `replica_sync`, `ood_set` (the
  packaged out-of-domain questions, `data/`);
- `tuning/`: `infercache tune`, offline — calibration replayed as served, `tune LOG` from the
  gateway's request log, the fitted matcher (its own docstring draws it).

Nothing here is imported eagerly: torch, transformers, usearch and httpx load only when the
class that needs them is built.
"""
