"""What a layer's hit does before its answer is returned (`LayerHits`), one method per layer.

    exact(req, lookup):     count the hit (its tokens, the upstream time and the money the
                            stored answer cost once), remember the answer by response id and
                            tenant (`Cache.report_wrong`), and return the stored bytes as `raw`
                            too, so a reply can send them without serialising them again
    semantic(layer, req, lookup, hit, verify):
                            count the prompt tokens on both layers (both looked the request
                            up), hand the hit to live verification (it samples in the
                            background, never on this call's path), store the answer under
                            this request's exact key when the layer says so, and remember it
                            with the near-duplicate's key, score and group

Both return the `Completion` with the entry's age; the misses before a semantic hit are counted
by the caller (cache.py), which knows why the exact layer missed.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from infercache.completion import Completion, Layer, Response
from infercache.exact import ExactCache, Lookup
from infercache.metrics import PriceTable, StrategyMetrics
from infercache.request import ChatRequest
from infercache.semantic.layer import SemanticHit, SemanticLayer
from infercache.semantic.verify import Fetch
from infercache.served_answers import SemanticServing, ServedAnswers, ServedBy


@dataclass(eq=False, repr=False, slots=True)
class LayerHits:
    """The hit side of one cache's layers: its exact layer, metrics, prices and served answers."""

    exact_layer: ExactCache
    exact_metrics: StrategyMetrics
    prices: PriceTable
    served: ServedAnswers

    def exact(self, req: ChatRequest, lookup: Lookup) -> Completion:
        entry = lookup.entry
        assert entry is not None
        self.exact_metrics.hit(
            prompt_tokens=entry.prompt_tokens,
            completion_tokens=entry.completion_tokens,
            upstream_s=entry.upstream_s,
            money_usd=self.prices.cost_usd(
                entry.model, entry.prompt_tokens, entry.completion_tokens
            ),
            seen_prompt_tokens=entry.prompt_tokens,
        )
        response: Response = orjson.loads(entry.response)
        self.served.remember(
            req.directives.tenant, response.get("id"), ServedBy.EXACT, (lookup.key,)
        )
        age_s = self.exact_layer.age_s(entry)
        return Completion(response, Layer.EXACT, age_s=age_s, key=lookup.key, raw=entry.response)

    def semantic(
        self,
        layer: SemanticLayer,
        req: ChatRequest,
        lookup: Lookup,
        hit: SemanticHit,
        verify: Fetch | None,
    ) -> Completion:
        response: Response = orjson.loads(hit.entry.response)
        for metrics in (self.exact_metrics, layer.metrics):  # both looked it up
            metrics.prompt_tokens(hit.entry.prompt_tokens)
        if verify is not None:
            layer.verify(hit, req.body, response, verify)
        keys: tuple[str, ...] = (hit.key,)
        if layer.config.store_hits_as_exact:
            self.exact_layer.store(lookup, req, response, upstream_s=hit.entry.upstream_s)
            keys = (hit.key, lookup.key)
        serving = SemanticServing(hit.key, hit.score, hit.group)
        self.served.remember(
            req.directives.tenant, response.get("id"), ServedBy.SEMANTIC, keys, serving
        )
        return Completion(
            response,
            Layer.SEMANTIC,
            age_s=self.exact_layer.age_s(hit.entry),
            key=hit.key,
            similarity=hit.similarity,
        )
