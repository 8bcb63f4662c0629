"""Fuzz the gateway with 10,000 Hypothesis-made requests and print the figures.

    .venv/bin/python bench/fuzz.py [--examples 10000]

Runs tests/gateway/test_fuzz.py (a real gateway on loopback, the stand-in upstream behind it)
with `INFERCACHE_FUZZ_EXAMPLES`, and prints its report: requests tried, 5xx answers, answers by
status, entries stored and entries stored from refused requests. The test itself asserts 0 5xx,
the OpenAI error shape on every refusal, and a live gateway afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fuzz.json"
        env = {
            **os.environ,
            "INFERCACHE_FUZZ_EXAMPLES": str(args.examples),
            "INFERCACHE_FUZZ_REPORT": str(report),
        }
        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "--timeout=7200",
             "tests/gateway/test_fuzz.py"],
            cwd=ROOT, env=env, capture_output=True, text=True,
        )  # fmt: skip
        elapsed_s = time.monotonic() - started
        if run.returncode != 0:
            print(run.stdout[-4000:], run.stderr[-2000:])
            return run.returncode
        figures = json.loads(report.read_text())
    print(f"fuzzed the gateway with {figures['requests']:,} requests in {elapsed_s:.0f} s")
    print(f"  5xx answers: {figures['status_5xx']}")
    print(
        f"  504 for only-if-cached with nothing cached (HTTP's answer, RFC 9111): "
        f"{figures['only_if_cached_504']}"
    )
    print(f"  answers by status: {figures['by_status']}")
    print(
        f"  answers fetched upstream: {figures['answers_fetched']:,}; entries stored: "
        f"{figures['entries_stored']:,}; from refused requests: "
        f"{figures['entries_stored_from_refused_requests']}"
    )
    print("  gateway alive afterwards: yes (checked by the test)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
