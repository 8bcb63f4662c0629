"""How long `infercache tune LOG --fit` takes on a 10,000-request log (issue 23, acceptance 6:
at most 5 minutes on 2 cores).

    .venv/bin/python bench/semantic_fit_time.py [--bot banking77] [--requests 10000]
        [--target 0.01] [--threads 2]

The log is one generated support-bot day (tests/semantic/days/day.py) written in the format of
`serve --request-log` (a JSON line per request: timestamp, tenant, model, layer, status, the
request body and the response body), each answer the one the label-aware stand-in provider of
tests/semantic/days gives. `tune` runs as a user runs it (a process, MiniLM, every embedding
computed by the run); the figures are its wall time, the CPU time of the process (user + sys,
from the kernel's accounting of the waited-for child) and the load average before and after,
to stdout and OUT/results.json (default bench/out/semantic_fit_time). A refusal is a result,
reported with its message. `tune`'s stderr is a pseudo-terminal, as a user's would be, so
it draws its progress bar (tuning/progress.py draws one only on a terminal); the stages whose
bar was drawn, with the last percentage seen, are in the results (`progress_bars`) and the
whole screen in OUT/stderr.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.harness.processes import infercache_exe  # noqa: E402
from tests.semantic.days import answers, day  # noqa: E402


def write_log(path: Path, bot: day.Bot, requests: Sequence[day.Request]) -> Path:
    lines = []
    for i, r in enumerate(requests):
        body = {
            "model": "m",
            "temperature": 0,
            "messages": [
                {"role": "system", "content": bot.system},
                {"role": "user", "content": r.text},
            ],
        }
        reply = {
            "id": f"chatcmpl-{i}",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {
                        "role": "assistant",
                        "content": answers.answer_for(r.label, r.text, bot.phrasings),
                    },
                }
            ],
        }
        line = {"timestamp": 1_000.0 + i, "tenant": "", "model": "m", "layer": "miss",
                "status": 200, "request": body, "response": reply}  # fmt: skip
        lines.append(json.dumps(line))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_tune(out: Path, log: Path, target: float, threads: int) -> dict[str, Any]:
    argv = [
        infercache_exe(), "tune", str(log), "--fit", "--target-false-hit", str(target),
        "--judge", "exact", "--threads", str(threads), "--format", "json",
        "--out", str(out / "matcher"), "--write-config", str(out / "fitted.toml"),
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with Terminal() as terminal:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=terminal.fd, text=True,
                              env={**os.environ, "COLUMNS": "100"})  # fmt: skip
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    screen = terminal.text()
    (out / "stderr.txt").write_text(screen, encoding="utf-8")
    figures: dict[str, Any] = {"wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
                               "progress_bars": dict(BAR.findall(screen))}  # fmt: skip
    if done.returncode == 0:
        report = json.loads(done.stdout)
        figures.update(threshold=report.get("threshold"), served=report.get("served"),
                       false_hits=report.get("false_hits"),
                       false_hit_upper=report.get("false_hit_upper"))  # fmt: skip
    else:
        lines = [line for line in screen.splitlines() if line.strip()]
        figures["refused"] = (lines or ["(no message)"])[-1]
    return figures


BAR = re.compile(r"(embedding texts|training the adapter)\s.*?(\d+%)")


class Terminal:
    """A pseudo-terminal for the child's stderr (so `tune` draws its progress bar, as for a
    user at a terminal), read on a thread into `text()`."""

    def __enter__(self) -> Terminal:
        self._master, self.fd = pty.openpty()
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read)
        self._reader.start()
        return self

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # the child closed its end (EIO)
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
        self._reader.join()
        os.close(self._master)

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", "replace")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_fit_time")
    parser.add_argument("--bot", default="banking77")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--target", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    bot = day.support_bot(args.bot)
    first = day.bot_day(bot, 1, day.DaySpec(requests=args.requests))
    log = write_log(args.out / "day.jsonl", bot, first.requests)
    load_before = os.getloadavg()
    figures = run_tune(args.out, log, args.target, args.threads)
    results = {"bot": args.bot, "requests": args.requests, "target": args.target,
               "load_before": load_before, "load_after": os.getloadavg(), **figures}  # fmt: skip
    print(json.dumps(results, indent=2))
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
