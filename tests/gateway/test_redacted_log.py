"""`serve --redact` writes a request log the analyzer can analyse (issue 10, acceptance 2): a
real gateway in front of the stand-in provider gets a support-bot day (a ~150-token system
prompt on every call, Zipf-popular FAQ repeats, short unique questions) twice, once logging
plain and once redacted. `infercache analyze` on the redacted log finds the same exact repeats,
the same shared-prefix share within a point and gives the same recommendation as on the plain
log, and no prompt text is in the redacted file."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.cli import register
from infercache.engine.config import default_data_dir
from infercache.redaction import REDACTION_VERSION
from infercache.tokenizing.tokenizers import packaged_tokenizer_dir
from tests.analyze.generators import SHORT_SUPPORT_SYSTEM, short_support_bot
from tests.gateway.conftest import MakeGateway, Running


def _analyse(log: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="infercache")
    register(parser.add_subparsers())
    argv = ["analyze", str(log), "--format", "json", "--tokenizer", "smollm2", "--no-semantic"]
    args = parser.parse_args(argv)
    assert args.handler(args, environ={"INFERCACHE_DATA_DIR": str(data_dir)}) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def _send(running: Running, bodies: list[dict[str, Any]]) -> None:
    with running.client() as client:
        for body in bodies:
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    log = running.built.gateway.request_log
    assert log is not None
    log.close()


@pytest.mark.slow  # the packaged tokenizer, at the gateway and in the analyzer
def test_analyze_on_a_redacted_gateway_log_matches_the_plain_log(
    make_gateway: MakeGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tokenizer files the gateway extracts from the packaged model on its first start,
    # copied from the shared data dir so each test does not extract them again.
    shared = packaged_tokenizer_dir(default_data_dir(os.environ))
    shutil.copytree(shared, tmp_path / "tokenizers" / shared.name)
    day = short_support_bot(seed=7, n=160)
    bodies = [record["request"] for record in day.records]
    plain_log, redacted_log = tmp_path / "plain.jsonl", tmp_path / "redacted.jsonl"
    # each gateway its own store (a process's memory), so each sees the day from the start
    _send(make_gateway(request_log=plain_log, store_url="memory://"), bodies)
    _send(make_gateway(request_log=redacted_log, redact=True, store_url="memory://"), bodies)

    text = redacted_log.read_text()
    assert SHORT_SUPPORT_SYSTEM[:40] not in text
    assert not any(body["messages"][1]["content"] in text for body in bodies)
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == len(bodies)
    assert {line["redaction"] for line in lines} == {REDACTION_VERSION}
    assert all("request" not in line and "response" not in line for line in lines)
    assert {line["layer"] for line in lines} == {"miss", "exact-hit"}
    assert all(line["upstream_ms"] > 0 for line in lines if line["layer"] == "miss")

    plain = _analyse(plain_log, tmp_path, capsys)
    redacted = _analyse(redacted_log, tmp_path, capsys)
    repeats = sum(day.truth.exact_repeat) / len(bodies)
    assert repeats > 0.3
    assert redacted["requests"] == plain["requests"] == len(bodies)
    assert redacted["census"]["exact_repeat"] == pytest.approx(repeats)
    assert plain["census"]["exact_repeat"] == pytest.approx(repeats)
    # every request that is not a repeat shares the system prompt: most of its prompt
    assert redacted["census"]["shared_prefix"] == pytest.approx(1 - repeats, abs=0.02)
    assert redacted["prefix_token_share"] > 0.8
    assert redacted["prefix_token_share"] == pytest.approx(plain["prefix_token_share"], abs=0.01)
    assert redacted["prompt_tokens"] == plain["prompt_tokens"] > 100 * len(bodies)
    assert redacted["settings"]["tokenizer"].startswith(plain["settings"]["tokenizer"])
    assert redacted["recommendation"]["strategies"] == ["exact", "prefix"]
    assert plain["recommendation"]["strategies"] == ["exact", "prefix"]
