"""Analyzer bench: a simulated day of 1,000,000 requests through `infercache analyze`.
Figures go to stdout and to OUT/results.json; bench/README.md ("Analyzer") records them.

    .venv/bin/python bench/analyze.py [--data /work/shared/data] [--out bench/out/analyze]
        [--requests 1000000] [--sections census,default,mooncake,redacted,request-log]
        [--tokenizers chars4,smollm2] [--seed 0]

Sections, each in child processes of this one (so each one's peak RSS is its own):
- `census`: the census alone (no near-duplicates, no replay), per tokenizer, with the CLI's
  defaults for a log this size (reading and parsing in a second process). Target ≤ 2 min.
- `default`: `infercache analyze DAY --format json --out FILE`, nothing else: the packaged
  SmolLM2 tokenizer, near-duplicates by the packaged public calibration on a uniform sample,
  the replays (layered and prefix alone), the KV sweep. Target ≤ 5 min and ≤ 2 GiB.
  Beside it, in the same run: reading and parsing the day alone (the floor no analysis beats).
- `mooncake`: the shared Mooncake trace, the whole file, analysed by default: the
  recommendation, the KV sweep and its knee, against real bounded replays at a few budgets.
- `redacted`: a generated day written plain and redacted (redaction.redact_request, as the
  gateway's request log does), both analysed: exact share, prefix share, recommendation.
- `request-log`: what closing a request's log entry costs on the gateway's request path, plain
  against `serve --redact` (the packaged tokenizer, the deployment's `Redactor` and its chain
  memo) and against redacting without the memo, on a support-bot day; rounds interleaved.
CPU seconds are given per process: on a shared 2-core box the wall time depends on the load,
which each figure is printed with.

The day (gzip JSONL of gateway-style records, written once per parameter set into OUT) mixes
four tenants, built from public data read in place:
- `acme` (55%): a support bot: one ~1,900-character system prompt, banking77 questions picked
  by intent with Zipf popularity, then phrasing (so the popular phrasings repeat exactly);
- `ops` (20%): the same questions behind a short system prompt that starts with the current
  time: a prefix breaker;
- `chat` (15%): ShareGPT conversations replayed turn by turn (each request extends the last);
- `docs` (10%): arena-hard prompts made unique, behind a shared style guide.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.analyze.generators: the shared prompts

from tests.analyze.generators import (  # noqa: E402
    DRAFTING_STYLE_GUIDE,
    SUPPORT_SYSTEM,
    multi_turn_chat,
    short_support_bot,
    write_twins,
)

DAY_S = 86_400.0
START_S = 1_735_689_600.0  # 2025-01-01T00:00:00Z
MIX = (("acme", 0.55), ("ops", 0.20), ("chat", 0.15), ("docs", 0.10))
OPS_SYSTEM = (
    "You are the operations assistant. Answer with the exact console steps, one per line, "
    "and warn before anything destructive. Never reveal internal hostnames or credentials. "
    "If the request is about a bank card, hand it to the support bot."
)


# --- the day -------------------------------------------------------------------------------


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


# --- measurements (each in a child process: `bench/analyze.py _child KIND ARGS...`) -----------


def usage() -> dict[str, Any]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cpu_s_main_process": me.ru_utime + me.ru_stime,
        "cpu_s_reader_process": kids.ru_utime + kids.ru_stime,
        "peak_rss_mib_main_process": me.ru_maxrss / 1024,
        "peak_rss_mib_reader_process": kids.ru_maxrss / 1024,
        "load_average": os.getloadavg(),
    }


def census_child(log: str, tokenizer: str) -> dict[str, Any]:
    import functools

    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions
    from infercache.settings import Settings
    from infercache.tokenizing.tokenizers import load_tokenizer

    settings = Settings.load({})
    load_tokenizer(tokenizer, settings.data_dir)  # converts the packaged model once, untimed
    started = time.perf_counter()
    analysis = Analyzer(
        AnalyzeOptions(),
        settings=settings,
        tokenizer=functools.partial(load_tokenizer, tokenizer, settings.data_dir),
        replay=False,
        parallel=True,
        freeze_gc=True,
    ).run([Path(log)])
    wall = time.perf_counter() - started
    total = analysis.census.total
    return {
        "tokenizer": tokenizer,
        "requests": total.requests,
        "wall_s": wall,
        **usage(),
        "census": total.shares(),
        "prefix_token_share": total.prefix_token_share,
        "prompt_tokens": total.prompt_tokens,
        "prefix_tree_tokens": analysis.census.prefix.cached_tokens,
        "prefix_bounded": analysis.census.prefix_bounded,
        "breakers": [(b.tenant, b.kind, b.requests) for b in analysis.breakers[:3]],
    }


def default_child(log: str, out: str) -> dict[str, Any]:
    from infercache.cli import main

    started = time.perf_counter()
    code = main(["analyze", log, "--format", "json", "--out", out])
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"infercache analyze exited {code}")
    report = json.loads(Path(out).read_text())
    near = report["near_duplicates"]
    return {
        "wall_s": wall,
        **usage(),
        "requests": report["requests"],
        "census": report["census"],
        "prefix_token_share": report["prefix_token_share"],
        "recommendation": report["recommendation"]["layering"],
        "tokenizer": report["settings"]["tokenizer"],
        "near_duplicates": {
            k: near.get(k)
            for k in (
                "share",
                "interval",
                "sample_rate",
                "checked",
                "texts_embedded",
                "candidate_texts_embedded",
                "embed_s",
                "label",
            )
        },
        "knee": report["kv_sweep"]["knee"],
        "exact_hit_rate": report["simulation"]["exact"].get("hit_rate"),
    }


def reading_child(log: str) -> dict[str, Any]:
    from infercache.analyze.log_reader import LogReader

    started = time.perf_counter()
    lines = sum(1 for _ in LogReader([Path(log)]))
    return {"lines": lines, "wall_s": time.perf_counter() - started, **usage()}


def mooncake_child(trace: str, budgets: str) -> dict[str, Any]:
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions
    from infercache.analyze.reports.document import build_report
    from infercache.settings import Settings
    from infercache.tokenizing.tokenizers import Chars4Tokenizer

    settings = Settings.load({})
    started = time.perf_counter()
    analysis = Analyzer(AnalyzeOptions(), settings=settings, tokenizer=Chars4Tokenizer).run(
        [Path(trace)]
    )
    report = build_report(analysis).to_dict()
    wall = time.perf_counter() - started
    curve = {p["budget_tokens"]: p["token_share"] for p in report["kv_sweep"]["curve"]}
    checks = []
    for budget in (int(b) for b in budgets.split(",")):
        bounded = Analyzer(
            AnalyzeOptions(prefix_capacity_tokens=budget), settings=settings,
            tokenizer=Chars4Tokenizer,
        ).run([Path(trace)])  # fmt: skip
        real = bounded.replays["prefix"].strategies["prefix"]["token_hit_rate"]
        checks.append({"budget_tokens": budget, "sweep": curve.get(budget), "replay": real})
    return {
        "wall_s": wall,
        "requests": report["requests"],
        "recommendation": report["recommendation"]["layering"],
        "reasons": {r["strategy"]: r["text"] for r in report["recommendation"]["reasons"]},
        "prefix_token_share": report["prefix_token_share"],
        "kv_sweep": report["kv_sweep"],
        "sweep_vs_replay": checks,
    }


def redacted_child(seed: str) -> dict[str, Any]:
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.options import AnalyzeOptions
    from infercache.analyze.reports.document import build_report
    from infercache.settings import Settings
    from infercache.tokenizing.tokenizers import load_tokenizer

    settings = Settings.load({})
    tokenizer = load_tokenizer("smollm2", settings.data_dir)
    out: dict[str, Any] = {"tokenizer": tokenizer.name}
    days = {
        "support bot (~150-token system prompt), 5,000 requests": short_support_bot(
            int(seed), 5000
        ),
        "multi-turn chat, 300 conversations": multi_turn_chat(int(seed), 300),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, gen in days.items():
            plain_log, redacted_log = write_twins(
                gen, Path(tmp), secret=os.urandom(32), tokenizer=tokenizer,
                policy=settings.policy(),
            )  # fmt: skip
            reports = [
                build_report(
                    Analyzer(AnalyzeOptions(), settings=settings, tokenizer=lambda: tokenizer).run(
                        [path]
                    )
                ).to_dict()
                for path in (plain_log, redacted_log)
            ]
            out[name] = {
                side: {
                    "exact_repeat": r["census"]["exact_repeat"],
                    "prefix_token_share": r["prefix_token_share"],
                    "recommendation": r["recommendation"]["layering"],
                    "log_bytes": path.stat().st_size,
                }
                for side, r, path in zip(
                    ("plain", "redacted"), reports, (plain_log, redacted_log), strict=True
                )
            }
    return out


def request_log_child(seed: str) -> dict[str, Any]:
    from infercache.clock import SystemClock
    from infercache.gateway.requestlog import LogEntry, RequestLog
    from infercache.gateway.tracing import NoTracer
    from infercache.gateway.traffic import RequestMetrics
    from infercache.redaction import Redactor, load_or_create_secret, redact_request
    from infercache.settings import Settings
    from infercache.tokenizing.tokenizers import load_tokenizer

    records = short_support_bot(int(seed), 3000).records
    tokenizer = load_tokenizer("smollm2", Settings.load({}).data_dir)
    times: dict[str, list[float]] = {"plain": [], "redacted": [], "redacted, no memo": []}
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp))
        secret = load_or_create_secret(settings.data_dir)
        redactor = Redactor(secret, tokenizer, settings.policy())
        clock, traffic = SystemClock(), RequestMetrics()
        logs = {
            "plain": RequestLog(Path(tmp) / "plain.jsonl"),
            "redacted": RequestLog(Path(tmp) / "redacted.jsonl", redactor=redactor),
        }

        def close(name: str, record: dict[str, Any]) -> None:
            if name == "redacted, no memo":
                redact_request(
                    record["request"], tenant="t", exact_key=None, secret=secret,
                    tokenizer=tokenizer, policy=settings.policy(),
                )  # fmt: skip
                return
            entry = LogEntry(
                logs[name],
                traffic,
                NoTracer().start("chat", "m"),
                clock,
                operation="chat",
                tenant="t",
                body=record["request"],
            )
            entry.close(status=200, response=record["response"])

        for rnd in range(3):  # the first round warms the caches and is not counted
            for name in times:
                for record in records:
                    started = time.perf_counter()
                    close(name, record)
                    if rnd:
                        times[name].append(time.perf_counter() - started)
        sizes = {n: (Path(tmp) / f"{n}.jsonl").stat().st_size // (3 * len(records)) for n in logs}
    out: dict[str, Any] = {"requests": len(records), "load_average": list(os.getloadavg())}
    for name, spans in times.items():
        spans.sort()
        out[name] = {f"p{q}_us": 1e6 * spans[int(len(spans) * q / 100)] for q in (50, 90, 99)} | (
            {"bytes_a_line": sizes[name]} if name in sizes else {}
        )
    return out


CHILDREN = {
    "census": census_child,
    "default": default_child,
    "reading": reading_child,
    "mooncake": mooncake_child,
    "redacted": redacted_child,
    "request-log": request_log_child,
}


def run_child(kind: str, *args: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "_child", kind, *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def report_census(r: dict[str, Any]) -> None:
    print(
        f"census [{r['tokenizer']}] {r['requests']:,} requests in {r['wall_s']:.1f} s (load "
        f"{r['load_average'][0]:.1f}; CPU {r['cpu_s_main_process']:.0f} s + reader "
        f"{r['cpu_s_reader_process']:.0f} s), peak RSS {r['peak_rss_mib_main_process']:,.0f} + "
        f"{r['peak_rss_mib_reader_process']:,.0f} MiB; "
        f"census {json.dumps({k: round(v, 3) for k, v in r['census'].items()})}, "
        f"prefix token share {r['prefix_token_share']:.3f}"
    )


def report_default(r: dict[str, Any], floor: dict[str, Any]) -> None:
    near = r["near_duplicates"]
    rss = r["peak_rss_mib_main_process"] + r["peak_rss_mib_reader_process"]
    print(
        f"default analysis: {r['requests']:,} requests in {r['wall_s']:.0f} s (load "
        f"{r['load_average'][0]:.1f}; CPU {r['cpu_s_main_process']:.0f} s + reader "
        f"{r['cpu_s_reader_process']:.0f} s), peak RSS {r['peak_rss_mib_main_process']:,.0f} + "
        f"{r['peak_rss_mib_reader_process']:,.0f} = {rss:,.0f} MiB; reading alone "
        f"{floor['wall_s']:.0f} s; tokenizer {r['tokenizer']}"
    )
    print(
        f"  near-duplicates {_pct(near['share'])} [{_pct(near['interval'][0])}, "
        f"{_pct(near['interval'][1])}] on a sample of {near['checked']:,} (rate "
        f"{near['sample_rate']:.4f}); MiniLM embedded {near['texts_embedded']:,} texts, static "
        f"{near['candidate_texts_embedded']:,}, {near['embed_s']:.0f} s embedding; "
        f"recommendation {r['recommendation']}; knee {r['knee']}"
    )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_child":
        print(json.dumps(CHILDREN[sys.argv[2]](*sys.argv[3:])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "analyze")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--sections", default="census,default,mooncake,redacted")
    parser.add_argument("--tokenizers", default="chars4,smollm2")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    results: dict[str, Any] = {"requests": args.requests}
    if {"census", "default"} & set(sections):
        log = generate(args.data, args.out, args.requests, args.seed)
        results["log"] = str(log)
    if "census" in sections:
        results["census"] = {}
        for tokenizer in args.tokenizers.split(","):
            results["census"][tokenizer] = r = run_child("census", str(log), tokenizer)
            report_census(r)
    if "default" in sections:
        floor = results["reading"] = run_child("reading", str(log))
        out = args.out / "default-report.json"
        results["default"] = r = run_child("default", str(log), str(out))
        report_default(r, floor)
    if "mooncake" in sections:
        trace = args.data / "mooncake_synthetic_trace.jsonl"
        results["mooncake"] = r = run_child("mooncake", str(trace), "1048576,4194304,16777216")
        print(
            f"mooncake: {r['requests']:,} requests in {r['wall_s']:.1f} s; "
            f"{r['recommendation']}; prefix token share {_pct(r['prefix_token_share'])}; "
            f"knee {r['kv_sweep']['knee']}; sweep vs replay {r['sweep_vs_replay']}"
        )
    if "redacted" in sections:
        results["redacted"] = r = run_child("redacted", str(args.seed))
        print(f"redacted twins ({r['tokenizer']}): " + json.dumps(r, indent=1))
    if "request-log" in sections:
        results["request-log"] = r = run_child("request-log", str(args.seed))
        print("request-log entry close: " + json.dumps(r, indent=1))
    (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
