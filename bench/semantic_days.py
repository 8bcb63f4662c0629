"""Support-bot days through a real gateway, beside the baselines (issue 23: item 6, acceptance
1–5). Every configuration is written by `infercache tune` as a user runs it and served by
`infercache serve` in front of the label-aware stand-in provider (tests/semantic/days).

    .venv/bin/python bench/semantic_days.py [--bots banking77,hwu64] [--phrasings 1,3]
        [--requests 3000] [--target 0.01] [--only log-fit,labels-fit,...] [--skip shadow,...]
        [--shadow-refit N]

Per bot (banking77, hwu64; tests/semantic/days/day.py) and answer variant (1 or 3 phrasings):
1. day 1 through `serve --request-log day1.jsonl`, semantic layer off;
2. configurations from day 1:
   - `log-fit`: `tune day1.jsonl --fit` — the deployment's own log (issue 23, item 2);
   - `labels-fit`: `tune day1-labels.csv --fit` — today's fitted matcher on day 1's texts with
     their true labels;
   - `labels-plain`: `tune day1-labels.csv` — a plain cosine threshold on the same texts;
   - `cosine-0.93`: a written threshold of 0.93 (the one `tune` picks on public pairs);
   a configuration `tune` refuses is reported with its message and serves nothing;
3. day 2 through a fresh gateway per configuration (`serve --semantic --config`), scored
   (tests/semantic/days/scoring.py): recall of same-answer paraphrases, wrong share of semantic
   answers, out-of-domain answered;
4. `shadow`: nothing tuned, one gateway with `--semantic=shadow` (judge `exact` with one
   phrasing, `embedding` with three) over day 1 then day 2, scored per day (acceptance 3);
   `--shadow-refit N` sets `shadow_refit_every` (the head refitted every N judged pairs; 0
   never; the gateway's default otherwise);
5. `poison` (banking77 only): each configuration on a fresh gateway asked the 100 attacks
   (attacker first, then the plain question and a paraphrase) and the 300 swaps (acceptance 5).
Then `cross` (acceptance 4: each bot's configurations serve the other bot's day 2) and `ood`
(acceptance 1: `tune tests/semantic/data/banking77_slice.csv` at 0.05, plain and `--fit`; a
gateway asked 600 banking77 requests, then the 300 held-out out-of-domain questions).

Figures to stdout and OUT/results.json (default bench/out/semantic_days). MiniLM runs in every
gateway with the semantic layer on; expect about a minute per 3,000-request day on 2 cores,
plus each `tune --fit`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.harness.processes import infercache_exe  # noqa: E402
from tests.semantic.days import adversarial, corpus, day, scoring  # noqa: E402
from tests.semantic.days.gateway_run import day_gateway  # noqa: E402

SLICE = ROOT / "tests" / "semantic" / "data" / "banking77_slice.csv"
CONFIGS = ("log-fit", "labels-fit", "labels-plain", "cosine-0.93")


class Run:
    """One bench run: where it writes, what it was asked to do."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out = args, args.out
        self.results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}

    def wanted(self, name: str) -> bool:
        only, skip = self.args.only, self.args.skip
        return (not only or name in only.split(",")) and name not in skip.split(",")

    def record(self, path: Sequence[str], value: Any) -> None:
        node = self.results
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "results.json").write_text(json.dumps(self.results, indent=2, default=str))


def serve_batches(
    workdir: Path,
    labels: dict[str, str],
    phrasings: int,
    system: str,
    batches: Sequence[Sequence[day.Request]],
    flags: Sequence[str] = (),
    request_log: Path | None = None,
) -> tuple[list[scoring.Score], str, dict[str, Any]]:
    """Every batch through one gateway, in order; a score per batch, the ready line, /stats."""
    scorer = scoring.Scorer(phrasings)
    scores = []
    with day_gateway(
        workdir, labels, phrasings=phrasings, flags=flags, request_log=request_log
    ) as gateway:
        for batch in batches:
            started = time.perf_counter()
            outcomes = gateway.run(system, batch, progress=_progress(len(batch)))
            scores.append(scorer.add(batch, outcomes))
            print(f"      {len(batch)} requests in {time.perf_counter() - started:.0f} s")
        if gateway.upstream.unknown:
            raise RuntimeError(f"questions without a label: {gateway.upstream.unknown[:3]}")
        return scores, gateway.ready, gateway.stats()


def _progress(total: int) -> Any:
    def show(done: int) -> None:
        if done % 500 == 0 or done == total:
            print(f"\r      {done}/{total}", end="\n" if done == total else "", flush=True)

    return show


def tune(workdir: Path, source: Path, *, fit: bool, target: float, name: str) -> dict[str, Any]:
    """`infercache tune SOURCE [--fit] --write-config`: the config's path and tune's report,
    or its refusal."""
    config = workdir / f"{name}.toml"
    argv = [
        infercache_exe(), "tune", str(source), "--target-false-hit", str(target),
        "--write-config", str(config), "--format", "json", "--threads", "2",
    ]  # fmt: skip
    if fit:
        argv += ["--fit", "--out", str(workdir / f"matcher-{name}")]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ})
    seconds = round(time.perf_counter() - started, 1)
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        print(f"    tune {name}: refused in {seconds} s: {message}")
        return {"config": None, "refused": message, "seconds": seconds}
    report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else done.stdout
    threshold = report.get("threshold") if isinstance(report, dict) else None
    print(f"    tune {name}: threshold {threshold} in {seconds} s")
    return {"config": str(config), "report": report, "seconds": seconds}


def write_labels(path: Path, rows: Sequence[tuple[str, str]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("text", "label"))
        writer.writerows(rows)
    return path


def configurations(run: Run, workdir: Path, log: Path, first: day.Day) -> dict[str, Any]:
    target = run.args.target
    labels_csv = write_labels(workdir / "day1-labels.csv", first.labelled())
    made: dict[str, Any] = {}
    for name in CONFIGS:
        if not run.wanted(name):
            continue
        if name == "cosine-0.93":
            path = workdir / "cosine-0.93.toml"
            path.write_text('[semantic]\nthreshold = 0.93\nembedder = "minilm"\n')
            made[name] = {"config": str(path)}
        else:
            source = log if name == "log-fit" else labels_csv
            made[name] = tune(workdir, source, fit=name.endswith("fit"), target=target, name=name)
    return made


def run_variant(run: Run, name: str, phrasings: int) -> dict[str, Any]:
    bot = day.support_bot(name, phrasings=phrasings)
    spec = day.DaySpec(requests=run.args.requests)
    first, second = day.bot_day(bot, 1, spec), day.bot_day(bot, 2, spec)
    labels = bot.label_of()
    workdir = run.out / f"{name}-p{phrasings}"
    key = (name, f"phrasings-{phrasings}")
    print(f"\n== {name}, {phrasings} phrasing(s): {len(bot.faqs)} FAQs, days of {spec.requests}")
    log = workdir / "day1.jsonl"
    log.unlink(missing_ok=True)
    print("  day 1, semantic off (the request log)")
    (day1,), _, _ = serve_batches(
        workdir / "day1", labels, phrasings, bot.system, [first.requests], request_log=log
    )
    run.record([*key, "day1-off"], day1.as_dict())
    made = configurations(run, workdir, log, first)
    run.record([*key, "configs"], made)
    for config, info in made.items():
        if info["config"] is None:
            continue
        print(f"  day 2 with {config}")
        (score,), ready, _ = serve_batches(
            workdir / f"day2-{config}", labels, phrasings, bot.system, [second.requests],
            flags=("--semantic", "--config", info["config"]),
        )  # fmt: skip
        print(f"    {score.line()}")
        run.record([*key, "day2", config], {**score.as_dict(), "ready": ready})
    if run.wanted("shadow"):
        judge = "exact" if phrasings == 1 else "embedding"
        shadow = workdir / "shadow.toml"
        every = run.args.shadow_refit
        refit = "" if every is None else f"shadow_refit_every = {every}\n"
        shadow.write_text(f'[semantic]\nmode = "shadow"\njudge = "{judge}"\n{refit}')
        refits = "default" if every is None else every
        print(f"  shadow ({judge} judge, refit every {refits}) over day 1 then day 2")
        scores, _, stats = serve_batches(
            workdir / "shadow", labels, phrasings, bot.system, [first.requests, second.requests],
            flags=("--semantic=shadow", "--config", str(shadow)),
        )  # fmt: skip
        for number, score in enumerate(scores, 1):
            print(f"    day {number}: {score.line()}")
        run.record([*key, "shadow"], {"day1": scores[0].as_dict(), "day2": scores[1].as_dict(),
                                      "stats": stats.get("semantic")})  # fmt: skip
    if name == "banking77" and run.wanted("poison"):
        poison(run, key, workdir, bot, made)
    return {"bot": bot, "second": second, "configs": made}


def poison(
    run: Run, key: tuple[str, str], workdir: Path, bot: day.Bot, made: dict[str, Any]
) -> None:
    attack = adversarial.attack_requests(adversarial.attacks())
    swap = adversarial.swap_requests(adversarial.swaps())
    labels = {**bot.label_of(), **{r.text: r.label for r in attack + swap}}
    for config, info in made.items():
        if info["config"] is None:
            continue
        print(f"  attacks and swaps with {config}")
        (attacked, swapped), _, _ = serve_batches(
            workdir / f"poison-{config}", labels, bot.phrasings, bot.system, [attack, swap],
            flags=("--semantic", "--config", info["config"]),
        )  # fmt: skip
        print(f"    attacks: {attacked.line()}\n    swaps: {swapped.line()}")
        run.record([*key, "poison", config], {"attacks": attacked.as_dict(),
                                              "swaps": swapped.as_dict()})  # fmt: skip


def cross(run: Run, variants: dict[tuple[str, int], dict[str, Any]]) -> None:
    for (tuned_on, phrasings), tuned in variants.items():
        for (served_on, other_phrasings), served in variants.items():
            if served_on == tuned_on or other_phrasings != phrasings:
                continue
            bot, second = served["bot"], served["second"]
            for config, info in tuned["configs"].items():
                if info["config"] is None:
                    continue
                print(f"  cross: {config} tuned on {tuned_on}, day 2 of {served_on}")
                (score,), _, _ = serve_batches(
                    run.out / f"cross-{tuned_on}-{served_on}-p{phrasings}-{config}",
                    bot.label_of(), phrasings, bot.system, [second.requests],
                    flags=("--semantic", "--config", info["config"]),
                )  # fmt: skip
                print(f"    {score.line()}")
                run.record(["cross", f"{tuned_on}->{served_on}", f"phrasings-{phrasings}",
                            config], score.as_dict())  # fmt: skip


def ood_probe(run: Run) -> None:
    """Acceptance 1: banking-only configs, then 300 questions from elsewhere."""
    workdir = run.out / "ood"
    workdir.mkdir(parents=True, exist_ok=True)
    bot = day.support_bot("banking77")
    warm = list(day.bot_day(bot, 1).requests[:600])
    probe = [day.Request(t, corpus.ood_label(t), "ood") for t in corpus.acceptance_ood()]
    labels = {**bot.label_of(), **{r.text: r.label for r in probe}}
    for name, fit in (("slice-plain", False), ("slice-fit", True)):
        info = tune(workdir, SLICE, fit=fit, target=0.05, name=name)
        run.record(["ood", name, "tune"], info)
        if info["config"] is None:
            continue
        (_, score), _, _ = serve_batches(
            workdir / name, labels, 1, bot.system, [warm, probe],
            flags=("--semantic", "--config", info["config"]),
        )  # fmt: skip
        print(f"    {name}: {score.ood_answered} of {score.ood_asked} out-of-domain answered")
        run.record(["ood", name, "probe"], score.as_dict())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_days")
    parser.add_argument("--bots", default="banking77,hwu64")
    parser.add_argument("--phrasings", default="1,3")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--target", type=float, default=0.01)
    parser.add_argument("--only", default="", help="comma list of steps/configs to run")
    parser.add_argument("--skip", default="", help="comma list of steps/configs to skip")
    parser.add_argument(
        "--shadow-refit", type=int, default=None,
        help="shadow step: judged pairs between background head refits (0: never; "
        "default: the gateway's)",
    )  # fmt: skip
    run = Run(parser.parse_args(argv))
    run.record(["load_before"], os.getloadavg())
    variants = {}
    for name in filter(None, run.args.bots.split(",")):  # --bots '' runs only `ood`
        for phrasings in map(int, run.args.phrasings.split(",")):
            variants[(name, phrasings)] = run_variant(run, name, phrasings)
    if run.wanted("cross"):
        cross(run, variants)
    if run.wanted("ood"):
        ood_probe(run)
    run.record(["load_after"], os.getloadavg())
    print(f"\nwrote {run.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
