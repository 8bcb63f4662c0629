"""The semantic layer's building blocks: text → unit vector (`embedder`), nearest cached vectors
(`index`), the one accept/reject rule shared by tuning and the live cache (`decision`, `guards`),
and threshold calibration on labelled pairs (`calibrate`, `pairs`).

Nothing here is imported eagerly: torch, transformers, faiss, usearch and httpx load only when
the class that needs them is built.
"""
