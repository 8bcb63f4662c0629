"""Acceptance 5: the official `openai` client against `infercache engine serve` (the real CLI
in a subprocess, on a free loopback port, with the packaged model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.harness.openai_streams import streamed
from tests.harness.processes import engine_server

MODEL = "SmolLM2-135M-Instruct"
DOCUMENT = (
    "Prefix caching keeps the attention keys and values of a prompt so a later prompt that "
    "starts the same way skips recomputing them. "
) * 12


@pytest.fixture(scope="module")
def served(smol_data_dir: Path, smol_resolved: object) -> Iterator[str]:
    """`infercache engine serve` on the packaged model, in a subprocess."""
    args = ["--max-kv-bytes", str(64 * 2**20), "--max-context-tokens", "2048"]
    with engine_server(args, env={"INFERCACHE_DATA_DIR": str(smol_data_dir)}) as url:
        yield f"{url}/v1"


@pytest.mark.slow
def test_openai_client_gets_answers_and_cached_tokens_from_the_cli_server(served: str) -> None:
    client = openai.OpenAI(base_url=served, api_key="unused", max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]

    def messages(question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": DOCUMENT}, {"role": "user", "content": question}]

    first = client.chat.completions.create(
        model=MODEL,
        messages=messages("What is prefix caching?"),
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    assert first.choices[0].message.content
    assert first.system_fingerprint is not None
    assert first.system_fingerprint.startswith("fp_")
    text, chunks = streamed(
        client, model=MODEL, messages=messages("Why does it help?"), max_tokens=8, temperature=0
    )
    assert text
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > len(DOCUMENT) // 8
    assert {c.system_fingerprint for c in chunks} == {first.system_fingerprint}
