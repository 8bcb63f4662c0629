"""bench/semantic_ceiling_stored.py checked against a real gateway: one fitted model at one
threshold, day 2 predicted in process and then served through `infercache serve --semantic
--config` (tests/semantic/days/gateway_run.py, the label-aware stand-in provider) and scored by
tests/semantic/days/scoring.py.

    .venv/bin/python bench/semantic_ceiling_gateway.py BOT THRESHOLD [--model whole|early]
        [--requests 3000] [--vectors /tmp/semceiling]

The model is today's fitted matcher as fit_log.fit_part fits it, on the whole of day 1
(`whole`, bench/semantic_ceiling.py's `fitted-whole`) or on its first half (`early`, what
`tune LOG --fit` serves), written as `tune` writes it (FitBase.save) with a config naming it at
THRESHOLD. Prints the prediction (`stored_at`) and the gateway's score, one JSON line each.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import semantic_ceiling_stored as storing  # noqa: E402
from semantic_days import serve_batches  # noqa: E402
from semantic_vectors import RememberingEmbedder  # noqa: E402

from infercache.semantic.embedder import MiniLMEmbedder, l2_normalise  # noqa: E402
from infercache.semantic.guards import default_guards  # noqa: E402
from infercache.semantic.matcher import AdaptedEmbedder  # noqa: E402
from infercache.semantic.ood_set import ood_texts  # noqa: E402
from infercache.semantic.tuning import fit_log as fl  # noqa: E402
from infercache.semantic.tuning.fit import FitBase  # noqa: E402
from infercache.semantic.tuning.intents import LabelledText  # noqa: E402
from tests.semantic.days import day  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("bot")
    parser.add_argument("threshold", type=float)
    parser.add_argument("--model", choices=("whole", "early"), default="whole")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--vectors", type=Path, default=Path("/tmp/semceiling"))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    embed = RememberingEmbedder(MiniLMEmbedder(threads=1), args.vectors)
    guards = default_guards()
    bot = day.support_bot(args.bot, phrasings=1)
    spec = day.DaySpec(requests=args.requests)
    d1, d2 = day.bot_day(bot, 1, spec), day.bot_day(bot, 2, spec)
    first = [LabelledText(r.text, r.label) for r in d1.requests]
    second = [LabelledText(r.text, r.label) for r in d2.requests]
    o = fl.LogFitOptions(target_false_hit=0.01, guards=tuple(guards), ood=tuple(ood_texts()))
    rows = first if args.model == "whole" else first[: round(o.fit_share * len(first))]
    model = fl.fit_part(fl.Part(rows, [""] * len(rows)), fl._Vectors(embed, None), o)
    work = Path(tempfile.mkdtemp(prefix="semantic_ceiling_gateway-"))
    FitBase(embed, "minilm", work / "matcher").save(model.adapter, model.matcher.head, {})
    vectors = l2_normalise(embed.embed([r.text for r in second]) @ model.adapter.T)
    predicted = storing.stored_at(second, vectors, model.matcher, guards, args.threshold)
    print("predicted", json.dumps(predicted), flush=True)
    config = work / "c.toml"
    config.write_text(
        "\n".join([
            "[semantic]",
            f"threshold = {args.threshold!r}",
            'embedder = "minilm"',
            f"embedder_name = {json.dumps(AdaptedEmbedder(embed.base, model.adapter).name)}",
            "target_false_hit = 0.01",
            f"guards = {json.dumps([g.name for g in guards])}",
            'calibrated_on = "bench/semantic_ceiling_gateway.py"',
            f"matcher = {json.dumps(str(work / 'matcher'))}",
            "",
        ])
    )  # fmt: skip
    started = time.monotonic()
    scores, _, _ = serve_batches(
        work / "day2", bot.label_of(), 1, bot.system, [d2.requests],
        flags=("--semantic", "--config", str(config)),
    )  # fmt: skip
    s = scores[0]
    gateway = {
        "recall": s.recall, "paraphrases": s.same_answer_paraphrases, "answered": s.answered,
        "semantic_answers": s.semantic_answers, "wrong": s.wrong, "ood_answered": s.ood_answered,
        "seconds": round(time.monotonic() - started),
    }  # fmt: skip
    print("gateway", json.dumps(gateway), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
