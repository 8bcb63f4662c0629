"""Analyzer bench: a day of 1,000,000 requests; the census's wall time and peak memory without
the semantic pass; the semantic pass's and the replay's rates. Figures go to stdout and to
OUT/results.json; bench/README.md ("Analyzer") records them.

    .venv/bin/python bench/analyze.py [--data /work/shared/data] [--out bench/out/analyze]
        [--requests 1000000] [--tokenizers chars4,smollm2] [--semantic-sample 5000]
        [--replay-sample 100000] [--seed 0]

The log (gzip JSONL of gateway-style records, one simulated day, written once per parameter
set into OUT) mixes four tenants, built from public data read in place:
- `acme` (55%): a support bot: one ~1,900-character system prompt, banking77 questions picked by
  intent with Zipf popularity, then phrasing (so the popular phrasings repeat exactly);
- `ops` (20%): the same questions behind a short system prompt that starts with the current
  time: a prefix breaker;
- `chat` (15%): ShareGPT conversations replayed turn by turn (each request extends the last),
  each replay a new session;
- `docs` (10%): arena-hard prompts made unique, behind a shared style guide.
The census runs in a child process per tokenizer, so its peak RSS (ru_maxrss of the child) is
the census's own. The semantic pass (all-MiniLM-L6-v2, batched) and the replay (layered and
prefix-alone, no sweep) are timed on the first requests of the same log.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.analyze.generators: the shared prompts

from tests.analyze.generators import DRAFTING_STYLE_GUIDE, SUPPORT_SYSTEM  # noqa: E402

DAY_S = 86_400.0
START_S = 1_735_689_600.0  # 2025-01-01T00:00:00Z
MIX = (("acme", 0.55), ("ops", 0.20), ("chat", 0.15), ("docs", 0.10))
OPS_SYSTEM = (
    "You are the operations assistant. Answer with the exact console steps, one per line, "
    "and warn before anything destructive. Never reveal internal hostnames or credentials. "
    "If the request is about a bank card, hand it to the support bot."
)


# --- the log -----------------------------------------------------------------------------


def read_sources(data: Path) -> dict[str, Any]:
    intents: dict[str, list[str]] = {}
    with (data / "banking77_train.csv").open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            intents.setdefault(row["category"], []).append(row["text"])
    chats = []
    with (data / "sharegpt_multiturn_sample.jsonl").open(encoding="utf-8") as f:
        for line in f:
            turns = json.loads(line)["conversations"]
            messages = [
                {
                    "role": "user" if t["from"] == "human" else "assistant",
                    "content": t["value"][:400],
                }
                for t in turns[:12]
            ]
            chats.append(messages)
    with (data / "arena_hard_v2.0_questions.jsonl").open(encoding="utf-8") as f:
        drafts = [json.loads(line)["prompt"][:800] for line in f]
    return {"intents": list(intents.values()), "chats": chats, "drafts": drafts}


class Day:
    """Yields records of one simulated day in time order."""

    def __init__(self, sources: dict[str, Any], requests: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sources = sources
        self.requests = requests
        intents = sources["intents"]
        self.intent_weights = [1 / (i + 1) ** 1.1 for i in range(len(intents))]
        self.sessions: list[tuple[list[dict[str, str]], int]] = []  # (conversation, next turn)
        self.serial = 0

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        return {"model": "gpt-4o-mini", "messages": messages, "temperature": 0}

    def question(self) -> str:
        phrasings = self.rng.choices(self.sources["intents"], self.intent_weights)[0]
        return str(self.rng.choice(phrasings[:40]))

    def chat(self) -> list[dict[str, str]]:
        if not self.sessions or self.rng.random() < 0.2:
            conversation = self.rng.choice(self.sources["chats"])
            session = [{"role": "system", "content": f"Session {self.serial}. Be helpful."}]
            self.sessions.append(([*session, *conversation], 2))
        i = self.rng.randrange(len(self.sessions))
        conversation, upto = self.sessions[i]
        last = len(conversation) - len(conversation) % 2  # end on a user turn
        upto = min(upto, last)
        messages = conversation[:upto]
        if upto + 2 > last:
            self.sessions.pop(i)
        else:
            self.sessions[i] = (conversation, upto + 2)
        return messages

    def record(self, ts: float) -> dict[str, Any]:
        self.serial += 1
        tenant = self.rng.choices([t for t, _ in MIX], [w for _, w in MIX])[0]
        if tenant == "acme":
            messages = [{"role": "system", "content": SUPPORT_SYSTEM},
                        {"role": "user", "content": self.question()}]  # fmt: skip
        elif tenant == "ops":
            stamp = datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="seconds")
            messages = [{"role": "system", "content": f"Time: {stamp}. {OPS_SYSTEM}"},
                        {"role": "user", "content": self.question()}]  # fmt: skip
        elif tenant == "chat":
            messages = self.chat()
        else:
            draft = self.rng.choice(self.sources["drafts"])
            messages = [{"role": "system", "content": DRAFTING_STYLE_GUIDE},
                        {"role": "user", "content": f"Draft {self.serial}. {draft}"}]  # fmt: skip
        completion = self.rng.randint(20, 400)
        return {
            "timestamp": round(ts, 3),
            "tenant": tenant,
            "model": "gpt-4o-mini",
            "request": self.body(messages),
            "layer": "miss",
            "status": 200,
            "completion_tokens": completion,
            "latency_ms": round(300 + 20 * completion + self.rng.expovariate(1 / 200), 1),
        }

    def __iter__(self) -> Any:
        gap = DAY_S / self.requests
        ts = START_S
        for _ in range(self.requests):
            ts += self.rng.expovariate(1 / gap)
            yield self.record(ts)


def generate(data: Path, out: Path, requests: int, seed: int) -> Path:
    path = out / f"day-{requests}-seed{seed}.jsonl.gz"
    if path.is_file():
        return path
    started = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as f:
        for record in Day(read_sources(data), requests, seed):
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
    tmp.rename(path)
    size = path.stat().st_size / 2**20
    print(f"generated {path} ({size:.0f} MiB gzip) in {time.perf_counter() - started:.0f} s")
    return path


# --- measurements ------------------------------------------------------------------------


def census_child(log: str, tokenizer: str, limit: int | None, parallel: bool) -> None:
    """Run in a child process: the census alone; prints one JSON line."""
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions
    from infercache.analyze.tokenizing.tokenizers import load_tokenizer
    from infercache.settings import Settings

    settings = Settings.load({})
    load_tokenizer(tokenizer, settings.data_dir)  # converts the packaged model once, untimed
    path = Path(log)
    if limit is not None:
        path = head(path, limit)
    started = time.perf_counter()
    factory = functools.partial(load_tokenizer, tokenizer, settings.data_dir)
    analysis = Analyzer(
        AnalyzeOptions(),
        settings=settings,
        tokenizer=factory,
        replay=False,
        parallel=parallel,
        freeze_gc=True,
    ).run([path])
    wall = time.perf_counter() - started
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = analysis.census.total
    print(
        json.dumps(
            {
                "tokenizer": tokenizer,
                "parallel": parallel,
                "requests": total.requests,
                "wall_s": wall,
                "cpu_s_census_process": cpu.ru_utime + cpu.ru_stime,
                "cpu_s_reader_process": child.ru_utime + child.ru_stime,
                "peak_rss_mib_reader_process": child.ru_maxrss / 1024,
                "load_average": os.getloadavg(),
                "requests_per_s": total.requests / wall,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "census": {c.value: n / total.requests for c, n in total.classes.items()},
                "prefix_token_share": total.reused_tokens / total.prompt_tokens,
                "prompt_tokens": total.prompt_tokens,
                "prefix_tree_tokens": analysis.census.prefix.cached_tokens,
                "prefix_tree_nodes": analysis.census.prefix.nodes,
                "prefix_bounded": analysis.census.prefix_bounded,
                "breakers": [(b.tenant, b.kind, b.requests) for b in analysis.breakers[:3]],
            }
        )
    )


def head(log: Path, n: int) -> Path:
    """The first n lines of a log, as its own file (cached next to it)."""
    out = log.with_name(f"{log.name.split('.')[0]}-head{n}.jsonl")
    if not out.is_file():
        with gzip.open(log, "rt", encoding="utf-8") as src, out.open("w", encoding="utf-8") as dst:
            for i, line in enumerate(src):
                if i >= n:
                    break
                dst.write(line)
    return out


def run_census(log: Path, tokenizer: str, limit: int | None, parallel: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "_census", str(log), tokenizer, str(limit or 0)]
    command.append("parallel" if parallel else "sequential")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"census child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def semantic_rate(log: Path, n: int, threads: int) -> dict[str, Any]:
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.census import Class
    from infercache.analyze.options import AnalyzeOptions, SemanticOptions
    from infercache.analyze.tokenizing.tokenizers import Chars4Tokenizer
    from infercache.semantic.embedder import MiniLMEmbedder
    from infercache.settings import Settings

    embedder = MiniLMEmbedder(threads=threads)
    options = AnalyzeOptions(semantic=SemanticOptions(0.85, "bench", embedder="minilm"))
    started = time.perf_counter()
    analysis = Analyzer(
        options,
        settings=Settings.load({}),
        tokenizer=Chars4Tokenizer,
        embedder=embedder,
        replay=False,
    ).run([head(log, n)])
    wall = time.perf_counter() - started
    run = analysis.semantic
    if run is None:
        raise SystemExit("the semantic pass did not run")
    total = analysis.census.total
    return {
        "threads": threads,
        "requests": total.requests,
        "wall_s": wall,
        "requests_per_s": total.requests / wall,
        "load_average": os.getloadavg(),
        "texts_embedded": run.texts_embedded,
        "embed_s": run.embed_s,
        "texts_per_s": run.texts_embedded / run.embed_s,
        "near_duplicate_share": total.classes[Class.NEAR_DUPLICATE] / total.requests,
        "mean_text_chars": run.chars_embedded / max(1, run.texts_embedded),
    }


def replay_rate(log: Path, n: int) -> dict[str, Any]:
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions
    from infercache.analyze.tokenizing.tokenizers import Chars4Tokenizer
    from infercache.settings import Settings

    sample = head(log, n)
    timings = {}
    for replay in (False, True):
        started = time.perf_counter()
        analysis = Analyzer(
            AnalyzeOptions(), settings=Settings.load({}), tokenizer=Chars4Tokenizer, replay=replay
        ).run([sample])
        timings[replay] = time.perf_counter() - started
    layered = analysis.replays["layered"]
    return {
        "requests": n,
        "census_s": timings[False],
        "census_and_replay_s": timings[True],
        "replay_requests_per_s": n / max(1e-9, timings[True] - timings[False]),
        "exact_hit_rate": layered.strategies["exact"]["hit_rate"],
        "prefix_token_hit_rate": analysis.replays["prefix"].strategies["prefix"]["token_hit_rate"],
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_census":
        census_child(sys.argv[2], sys.argv[3], int(sys.argv[4]) or None, sys.argv[5] == "parallel")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "analyze")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--tokenizers", default="chars4,smollm2")
    parser.add_argument(
        "--smollm2-requests",
        type=int,
        default=None,
        help="census the packaged tokenizer on the first N requests only",
    )
    parser.add_argument(
        "--parallel",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read and parse in a second process (the CLI's default for big logs)",
    )
    parser.add_argument("--semantic-sample", type=int, default=5000)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads for MiniLM (2 thrashes when busy)"
    )
    parser.add_argument("--replay-sample", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = generate(args.data, args.out, args.requests, args.seed)
    results: dict[str, Any] = {"log": str(log), "requests": args.requests, "census": {}}
    for tokenizer in args.tokenizers.split(","):
        limit = args.smollm2_requests if tokenizer == "smollm2" else None
        results["census"][tokenizer] = r = run_census(log, tokenizer, limit, args.parallel)
        print(
            f"census [{tokenizer}] {r['requests']:,} requests in {r['wall_s']:.1f} s "
            f"({r['requests_per_s']:,.0f}/s; CPU {r['cpu_s_census_process']:.0f} s + reader "
            f"{r['cpu_s_reader_process']:.0f} s; load {r['load_average'][0]:.1f}), peak RSS "
            f"{r['peak_rss_mib']:,.0f} MiB (reader {r['peak_rss_mib_reader_process']:,.0f}); "
            f"census {json.dumps({k: round(v, 3) for k, v in r['census'].items()})}, "
            f"prefix token share {r['prefix_token_share']:.3f}"
        )
    if args.replay_sample:
        results["replay"] = r = replay_rate(log, args.replay_sample)
        print(f"replay (layered + prefix alone): {r['replay_requests_per_s']:,.0f} requests/s")
    if args.semantic_sample:
        results["semantic"] = r = semantic_rate(log, args.semantic_sample, args.threads)
        print(
            f"semantic pass (MiniLM, batched, {r['threads']} thread(s)): "
            f"{r['texts_per_s']:,.0f} texts/s embedded, {r['requests_per_s']:,.0f} requests/s "
            f"overall (load {r['load_average'][0]:.1f})"
        )
    (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
