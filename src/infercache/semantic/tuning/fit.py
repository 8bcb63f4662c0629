"""`tune --fit`: fit a matcher to the user's intent-labelled texts, on CPU, and calibrate it on
texts it never saw.

Chosen by measurement (bench/README.md, "Fitting the matcher"): a linear adapter trained on
frozen embeddings plus a small logistic head beat fine-tuning MiniLM itself, which on 2 shared
cores took minutes per epoch for no better result.

Steps (`fit_matcher`):
  1. Split the labelled texts, per label and by a hash of each text (`intents.split_labelled`),
     into fit / head / calibration parts (default 50% / 20% / 30%): disjoint, so the reported
     bound is measured on texts neither trained part has seen.
  2. Embed every text once with the base embedder (the packaged MiniLM by default).
  3. Adapter: a `(dim, dim)` linear map, started at the identity, trained on the fit part with
     a supervised contrastive loss (SupCon, temperature `adapter_temperature`): each text is
     pulled towards the other texts of its label in the batch and pushed from the rest. AdamW,
     `epochs` passes in batches of 256.
  4. Head: the head and calibration texts form the simulated cache (cache_sim.py). The
     background similarity (95th percentile cosine between texts of different labels) is
     measured on it. Every head-part text is looked up in that cache, in it without the texts
     of its own label (a question whose answer is not cached yet: every candidate is wrong),
     and in sparser samples of it (`training_lookups`); each of the k candidates is a row of
     `matcher.features` labelled "same answer or not"; a logistic regression (L2, Newton
     steps) fits the four weights and bias.
  5. Calibrate: the lowest threshold on the head's probability whose false-hit rate (share of
     served answers that are wrong) has a 95% upper bound ≤ the target, over the calibration
     part's lookups only (`cache_sim.tune_lookups`). The plain cosine threshold is tuned on the
     same lookups for comparison.
  6. Write the artefacts (matcher.py) into `out_dir`.
`progress(stage, done, total)` is called as work advances (the CLI draws a bar). Randomness is
seeded. torch is imported only here, and only while fitting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.errors import InvalidRequestError
from infercache.semantic.embedder import Embedder, l2_normalise
from infercache.semantic.guards import Guard
from infercache.semantic.head_fit import fit_head
from infercache.semantic.matcher import (
    FEATURES,
    AdaptedEmbedder,
    CosineMatcher,
    FittedMatcher,
    Head,
    features,
    save_fitted,
)
from infercache.semantic.tuning.cache_sim import Embedded, LookupCase, simulate_lookups
from infercache.semantic.tuning.intents import LabelledText, split_labelled
from infercache.semantic.tuning.replay import ReplayCalibration, ReplayPlan, replay_calibration

FitProgress = Callable[[str, int, int], None]
EMBED_BATCH = 256


@dataclass(frozen=True, slots=True)
class FitOptions:
    target_false_hit: float = 0.01
    shares: tuple[float, float, float] = (0.5, 0.2, 0.3)  # fit, head, calibration
    epochs: int = 30
    adapter_temperature: float = 0.05
    learning_rate: float = 1e-3
    k: int = 8
    seed: int = 0
    guards: Sequence[Guard] = field(default_factory=tuple)
    ood: Sequence[str] = ()  # out-of-domain questions the calibration replays (replay.py)
    plan: ReplayPlan = field(default_factory=ReplayPlan)


@dataclass(frozen=True, slots=True)
class FitResult:
    directory: Path
    matcher: FittedMatcher
    fitted: ReplayCalibration
    """The fitted matcher at its calibrated threshold, on the calibration part replayed."""
    plain: ReplayCalibration | None
    """The plain cosine threshold tuned on the same lookups (None if none meets the target)."""
    report: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FitBase:
    """What a fit starts from and where it goes: the base embedder, its kind (written beside
    the matcher, so the layer loads the same base) and the matcher's directory."""

    embedder: Embedder
    kind: str
    out_dir: Path

    def save(
        self, adapter: npt.NDArray[np.float32], head: Head, report: dict[str, Any]
    ) -> FittedMatcher:
        """Writes the fitted matcher to `out_dir`; the matcher served, named for the adapted
        base."""
        save_fitted(
            self.out_dir,
            adapter=adapter,
            head=head,
            base=self.embedder,
            base_kind=self.kind,
            report=report,
        )
        return FittedMatcher(head, f"fitted:{AdaptedEmbedder(self.embedder, adapter).name}")


def fit_matcher(
    rows: Sequence[LabelledText],
    fit_base: FitBase,
    *,
    options: FitOptions | None = None,
    progress: FitProgress | None = None,
) -> FitResult:
    base = fit_base.embedder
    o = options or FitOptions()
    started = time.monotonic()
    fit_rows, head_rows, calib_rows = split_labelled(rows, o.shares, salt=f"fit{o.seed}")
    if min(len(fit_rows), len(head_rows), len(calib_rows)) < 2:
        raise InvalidRequestError(f"too few labelled texts to fit a matcher: {len(rows)}")
    texts = [r.text for r in (*fit_rows, *head_rows, *calib_rows)]
    vectors = embed_all(base, texts, progress)
    fit_v = vectors[: len(fit_rows)]
    rest_v = vectors[len(fit_rows) :]
    adapter = train_adapter(fit_v, [r.label for r in fit_rows], o, progress)
    # The head learns on its own part only: the calibration part stays unseen, as queries and
    # as cached candidates alike.
    adapted = l2_normalise(rest_v[: len(head_rows)] @ adapter.T)
    background = background_similarity(adapted, [r.label for r in head_rows], o.seed)
    head_part = Embedded(head_rows, adapted)
    head_cases = training_lookups(head_part, head_part, o)
    head = train_head(head_cases_rows(head_cases, background), o.k, background=background)
    matcher = FittedMatcher(head, "fitted:candidate")
    known = dict(zip(texts, vectors, strict=True))
    fitted = replay_calibration(
        calib_rows,
        lambda batch: l2_normalise(_memo_embed(base, batch, known) @ adapter.T),
        matcher,
        o.guards,
        target_false_hit=o.target_false_hit,
        ood=o.ood,
        plan=o.plan,
        k=o.k,
    )
    plain = _plain_baseline(calib_rows, base, known, o)
    report = {
        "texts": len(rows),
        "labels": len({r.label for r in rows}),
        "split": {"fit": len(fit_rows), "head": len(head_rows), "calibration": len(calib_rows)},
        "epochs": o.epochs,
        "seconds": round(time.monotonic() - started, 1),
        "calibration": fitted.to_dict(),
        "plain_cosine": plain.to_dict() if plain is not None else None,
    }
    served = fit_base.save(adapter, head, report)
    return FitResult(fit_base.out_dir, served, fitted, plain, report)


def embed_all(
    base: Embedder, texts: Sequence[str], progress: FitProgress | None
) -> npt.NDArray[np.float32]:
    out = np.zeros((len(texts), base.dim), dtype=np.float32)
    for start in range(0, len(texts), EMBED_BATCH):
        out[start : start + EMBED_BATCH] = base.embed(list(texts[start : start + EMBED_BATCH]))
        if progress is not None:
            progress("embed", min(start + EMBED_BATCH, len(texts)), len(texts))
    return out


def train_adapter(
    vectors: npt.NDArray[np.float32],
    labels: Sequence[str],
    o: FitOptions,
    progress: FitProgress | None = None,
) -> npt.NDArray[np.float32]:
    """The `(dim, dim)` map trained with SupCon (module docstring, step 3)."""
    import torch

    generator = torch.Generator().manual_seed(o.seed)
    names = {label: i for i, label in enumerate(sorted(set(labels)))}
    x = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
    y = torch.tensor([names[label] for label in labels])
    linear = torch.nn.Linear(x.shape[1], x.shape[1], bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.eye(x.shape[1]))
    optimiser = torch.optim.AdamW(linear.parameters(), lr=o.learning_rate, weight_decay=0.0)
    for epoch in range(o.epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(order), 256):
            batch = order[start : start + 256]
            z = torch.nn.functional.normalize(linear(x[batch]), dim=1)
            loss = _supcon(z, y[batch], o.adapter_temperature)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        if progress is not None:
            progress("adapter", epoch + 1, o.epochs)
    return linear.weight.detach().numpy().astype(np.float32)


def _supcon(z: Any, y: Any, temperature: float) -> Any:
    import torch

    similarity = z @ z.T / temperature
    eye = torch.eye(len(y), dtype=torch.bool)
    similarity = similarity.masked_fill(eye, -1e9)
    positive = (y[:, None] == y[None, :]) & ~eye
    log_prob = similarity - torch.logsumexp(similarity, dim=1, keepdim=True)
    has = positive.any(dim=1)
    if not bool(has.any()):
        return (z * 0).sum()
    return -((log_prob * positive).sum(dim=1)[has] / positive.sum(dim=1)[has]).mean()


def background_similarity(
    vectors: npt.NDArray[np.float32], labels: Sequence[str], seed: int, pairs: int = 20_000
) -> float:
    """The 95th percentile cosine of texts with different labels (sampled pairs)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, len(labels), pairs)
    b = rng.integers(0, len(labels), pairs)
    keep = np.array([labels[i] != labels[j] for i, j in zip(a, b, strict=True)])
    if not keep.any():
        return 0.0
    cosines = np.einsum("ij,ij->i", vectors[a[keep]], vectors[b[keep]])
    return float(np.quantile(cosines, 0.95))


def training_lookups(queries: Embedded, cache: Embedded, o: FitOptions) -> list[LookupCase]:
    """The head's examples: each query looked up in the whole cache, in the cache without its
    own label (its answer not cached yet), and in sparser caches (a quarter and a twentieth of
    the texts, as a live cache is early in the day), so agreement among few neighbours is not
    mistaken for certainty."""
    rng = np.random.default_rng(o.seed)
    cases = [
        *simulate_lookups(queries, cache, k=o.k),
        *simulate_lookups(queries, cache, k=o.k, without_own_label=True),
    ]
    for share in (0.25, 0.05):
        keep = np.flatnonzero(rng.random(len(cache.texts)) < share)
        if len(keep):
            cases += simulate_lookups(queries, cache.rows(keep), k=o.k)
    return cases


def head_cases_rows(
    cases: Sequence[LookupCase], background: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(features, same-answer labels) of every candidate of every case, for the head."""
    head = Head(weights=(0.0,) * FEATURES, bias=0.0, background=background)
    rows, labels = [], []
    for case in cases:
        neighbours = case.neighbours()
        rows.append(features(neighbours, head))
        labels += [c.label == case.query.label for c, _ in case.candidates]
    return np.vstack(rows), np.array(labels, dtype=np.float64)


def train_head(
    data: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]],
    k: int,
    *,
    background: float,
    l2: float = 1e-3,
    min_seen: int = 1,
) -> Head:
    """Logistic regression by Newton steps (module docstring, step 4; head_fit.py)."""
    x, y = data
    return fit_head(x, y, k, background=background, l2=l2, min_seen=min_seen)


def _memo_embed(
    base: Embedder, texts: Sequence[str], known: dict[str, npt.NDArray[np.float32]]
) -> npt.NDArray[np.float32]:
    """Base vectors of `texts`, embedding only those not in `known` (then remembered)."""
    new = [t for t in dict.fromkeys(texts) if t not in known]
    if new:
        known.update(zip(new, embed_all(base, new, None), strict=True))
    return np.stack([known[t] for t in texts]) if texts else np.zeros((0, base.dim), np.float32)


def _plain_baseline(
    calib_rows: Sequence[LabelledText],
    base: Embedder,
    known: dict[str, npt.NDArray[np.float32]],
    o: FitOptions,
) -> ReplayCalibration | None:
    """The plain cosine threshold calibrated on the same replay, for comparison."""
    try:
        return replay_calibration(
            calib_rows,
            lambda batch: _memo_embed(base, batch, known),
            CosineMatcher(),
            o.guards,
            target_false_hit=o.target_false_hit,
            ood=o.ood,
            plan=o.plan,
            k=o.k,
        )
    except InvalidRequestError:
        return None
