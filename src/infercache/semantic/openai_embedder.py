"""An `Embedder` backed by an OpenAI-compatible `POST {base_url}/embeddings` endpoint.

Request: `{"model", "input": [texts], "encoding_format": "float"}`, at most `batch_size` texts a
call. Response: `{"data": [{"index", "embedding"}]}`; rows are put back in input order by
`index` and L2-normalised here (not every server normalises). `dim` is configured, not probed,
so building the embedder does no I/O; a server returning another length is an `UpstreamError`.

httpx errors are translated here, the one boundary to this upstream:
- no answer (connect error, timeout, broken connection) → `UpstreamUnavailableError`;
- an HTTP status ≥ 400 → `UpstreamError` keeping the status and the JSON body when there is one;
- a 2xx body of the wrong shape → `UpstreamError` (status 502).

Thread-safe: one `httpx.Client` (thread-safe pool) is shared; `close()` releases it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx
import numpy as np

from infercache.errors import ConfigError, UpstreamError, UpstreamUnavailableError
from infercache.semantic.embedder import Matrix, l2_normalise


class OpenAIEmbedder:
    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        dim: int,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        batch_size: int = 256,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"embedding base_url must be an http(s) URL, got {base_url!r}")
        if dim < 1 or batch_size < 1 or timeout_s <= 0:
            raise ConfigError(
                f"dim, batch_size and timeout_s must be positive, "
                f"got dim={dim}, batch_size={batch_size}, timeout_s={timeout_s}"
            )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._url = base_url.rstrip("/") + "/embeddings"
        self._model = model
        self._batch_size = batch_size
        self._client = httpx.Client(headers=headers, timeout=timeout_s, transport=transport)
        self.dim: int = dim
        self.name: str = f"openai-compatible:{model}@{base_url.rstrip('/')};dim={dim};l2"

    def embed(self, texts: Sequence[str]) -> Matrix:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self._batch_size):
            batch = list(texts[start : start + self._batch_size])
            out[start : start + len(batch)] = self._embed_batch(batch)
        return l2_normalise(out)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIEmbedder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _embed_batch(self, texts: list[str]) -> Matrix:
        payload = {"model": self._model, "input": texts, "encoding_format": "float"}
        try:
            response = self._client.post(self._url, json=payload)
        except httpx.TransportError as exc:  # connect/read/write errors and timeouts
            raise UpstreamUnavailableError(
                f"embedding upstream {self._url} unreachable: {type(exc).__name__}: {exc}"
            ) from exc
        if response.status_code >= 400:
            raise UpstreamError(
                f"embedding upstream {self._url} answered HTTP {response.status_code}",
                status_code=response.status_code,
                body=_json_or_none(response),
            )
        return self._parse(response, len(texts))

    def _parse(self, response: httpx.Response, count: int) -> Matrix:
        body = _json_or_none(response)
        data = body.get("data") if body is not None else None
        if not isinstance(data, list) or len(data) != count:
            got = len(data) if isinstance(data, list) else "no"
            raise UpstreamError(
                f"embedding upstream {self._url} sent {got} embeddings for {count} inputs"
            )
        out = np.zeros((count, self.dim), dtype=np.float32)
        seen: set[int] = set()
        for position, item in enumerate(data):
            index = item.get("index", position) if isinstance(item, dict) else None
            vector = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(index, int) or not 0 <= index < count or index in seen:
                raise UpstreamError(f"embedding upstream {self._url} sent bad index {index!r}")
            if not isinstance(vector, list) or len(vector) != self.dim:
                length = len(vector) if isinstance(vector, list) else type(vector).__name__
                raise UpstreamError(
                    f"embedding upstream {self._url} sent a vector of length {length}, "
                    f"expected dim={self.dim}"
                )
            try:
                out[index] = np.asarray(vector, dtype=np.float32)
            except (TypeError, ValueError) as exc:
                raise UpstreamError(
                    f"embedding upstream {self._url} sent a non-numeric vector: {exc}"
                ) from exc
            seen.add(index)
        if not np.isfinite(out).all():
            raise UpstreamError(f"embedding upstream {self._url} sent a non-finite value")
        return out


def _json_or_none(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None
