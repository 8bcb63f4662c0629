"""A generated day through a real gateway: `infercache serve` started as a user starts it, in
front of a label-aware stand-in provider, asked one request at a time in time order.

`LabelUpstream` is tests/harness/upstreams.py's stand-in provider (real HTTP, OpenAI shapes,
usage, `system_fingerprint`, `/v1/models`) answering each question with its label's answer
(answers.py: one phrasing, or one of three by a hash of the question). A question it has no
label for is answered `unknown question` and recorded in `unknown` — a harness bug the scorer
then counts as wrong, never as right. The gateway's own version probe
(gateway/version_probe.py `probe_body`) is answered as the stand-in answers it, not recorded.

`day_gateway(workdir, labels, phrasings=..., flags=...)` starts both and yields a `DayGateway`:
`run(system, requests)` asks them in order and returns one `scoring.Outcome` each (layer from
the `x-infercache` header, answer text, status, `x-infercache-similarity`). The gateway keeps
its store (`sqlite:///WORKDIR/gateway.db` unless `store` is given), its data dir
(`WORKDIR/data`) and, with `request_log`, the request log that `tune LOG` reads; its output
is read all along (a day's logging would otherwise fill the pipe and stall it). Semantic flags
as a user passes them: `()` (off), `("--semantic", "--config", "c.toml")`,
`("--semantic=shadow",)`.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from infercache.gateway.version_probe import probe_body
from tests.conftest import free_port
from tests.harness.processes import start
from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream
from tests.semantic.days.answers import answer_for
from tests.semantic.days.day import Request
from tests.semantic.days.scoring import Outcome

MODEL = "support-model"


class LabelUpstream(FakeUpstream):
    def __init__(self, labels: Mapping[str, str], phrasings: int) -> None:
        super().__init__()
        self.labels, self.phrasings = labels, phrasings
        self.unknown: list[str] = []

    def completion(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        out = super().completion(body, n)
        if _is_version_probe(body):
            return out
        question = str(body["messages"][-1]["content"])
        label = self.labels.get(question)
        if label is None:
            self.unknown.append(question)
            answer = "unknown question"
        else:
            answer = answer_for(label, question, self.phrasings)
        out["choices"][0]["message"]["content"] = answer
        return out


def _is_version_probe(body: dict[str, Any]) -> bool:
    probe = probe_body(str(body.get("model", "")))
    return all(body.get(key) == value for key, value in probe.items())


def chat_body(system: str, text: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
        "temperature": 0,
    }


@dataclass
class DayGateway:
    client: httpx.Client
    upstream: LabelUpstream
    ready: str  # the gateway's ready line
    request_log: Path | None

    def ask(self, system: str, text: str) -> Outcome:
        reply = self.client.post("/v1/chat/completions", json=chat_body(system, text))
        if reply.status_code != 200:
            return Outcome(reply.headers.get("x-infercache", "error"), None, reply.status_code)
        similarity = reply.headers.get("x-infercache-similarity")
        return Outcome(
            reply.headers["x-infercache"],
            reply.json()["choices"][0]["message"]["content"],
            200,
            float(similarity) if similarity is not None else None,
        )

    def run(
        self,
        system: str,
        requests: Sequence[Request],
        progress: Callable[[int], None] | None = None,
    ) -> list[Outcome]:
        outcomes = []
        for index, request in enumerate(requests):
            outcomes.append(self.ask(system, request.text))
            if progress is not None:
                progress(index + 1)
        return outcomes

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.client.get("/stats").json()
        return stats


@contextlib.contextmanager
def day_gateway(
    workdir: Path,
    labels: Mapping[str, str],
    *,
    phrasings: int = 1,
    flags: Sequence[str] = (),
    request_log: Path | None = None,
    store: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[DayGateway]:
    workdir.mkdir(parents=True, exist_ok=True)
    upstream = LabelUpstream(labels, phrasings)
    with serve(upstream.app) as upstream_url:
        port = free_port()
        args = [
            "serve", "--port", str(port), "--upstream", f"{upstream_url}/v1",
            "--store", store or f"sqlite:///{workdir / 'gateway.db'}",
        ]  # fmt: skip
        if request_log is not None:
            args += ["--request-log", str(request_log)]
        process, ready = start(
            [*args, *flags],
            "gateway ready",
            on_stderr=False,
            env={"INFERCACHE_DATA_DIR": str(workdir / "data"), **(env or {})},
        )
        tail = _drain(process)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                yield DayGateway(client, upstream, ready.strip(), request_log)
        finally:
            process.terminate()
            code = process.wait(60)
            for thread in tail.threads:
                thread.join(10)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        if code not in (0, -15):
            raise RuntimeError(f"the gateway exited with {code}: {''.join(tail.lines)}")


@dataclass
class _Tail:
    lines: deque[str]
    threads: list[threading.Thread]


def _drain(process: subprocess.Popen[str]) -> _Tail:
    """Read the gateway's output for as long as it runs (a day's logging would otherwise fill
    the pipe and stall it), keeping the last lines for an error message."""
    tail = _Tail(deque(maxlen=200), [])
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            thread = threading.Thread(target=lambda s=stream: tail.lines.extend(s), daemon=True)
            thread.start()
            tail.threads.append(thread)
    return tail
