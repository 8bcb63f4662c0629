"""The near-duplicate matcher used when the user gave no calibration: the packaged MiniLM
embedder with a threshold calibrated on public paraphrase data, read from the data file beside
this module (default_matcher.json: threshold, guards, the candidate stage, what they measured,
and the provenance of every source file). bench/analyze_calibration.py regenerates the file.

Every result it produces is labelled PUBLIC_LABEL ("public calibration — tune on your own pairs
before serving"): a threshold transfers only to traffic like the pairs it was tuned on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from infercache.analyze.options import PUBLIC_LABEL, CandidateFilter, SemanticOptions
from infercache.errors import ConfigError

DATA_FILE = "default_matcher.json"
SCHEMA = "infercache.analyze.near_duplicates.default_matcher/1"


@dataclass(frozen=True, slots=True)
class DefaultMatcher:
    options: SemanticOptions
    embedder_name: str  # the embedder the threshold was calibrated with
    document: dict[str, Any]  # the whole data file, for the report's provenance

    @property
    def candidate_recall(self) -> float | None:
        """The candidate stage's worst measured recall on dense scopes."""
        scopes = self.document.get("candidates", {}).get("dense_scopes", {})
        recalls = [s["recall"] for s in scopes.values() if s.get("recall") is not None]
        return min(recalls) if recalls else None


def load_default_matcher() -> DefaultMatcher:
    try:
        text = (
            resources.files("infercache.analyze.near_duplicates")
            .joinpath(DATA_FILE)
            .read_text("utf-8")
        )
        doc = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the packaged {DATA_FILE} is missing or unreadable: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ConfigError(f"the packaged {DATA_FILE} is not a {SCHEMA} document")
    stage = doc["candidates"]
    options = SemanticOptions(
        threshold=float(doc["threshold"]),
        source=f"{PUBLIC_LABEL} ({DATA_FILE}, {doc['generated_by']})",
        embedder="minilm",
        guards=tuple(doc["guards"]),
        public=True,
        candidates=CandidateFilter(
            embedder="ngram3", k=int(stage["k"]), min_word_jaccard=float(stage["min_word_jaccard"])
        ),
    )
    return DefaultMatcher(options, str(doc["embedder"]), doc)
