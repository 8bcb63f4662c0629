"""Model versions as a provider really reports them (issue 29 item 0): several fingerprints at
once are one model, a fingerprint that displaces them all for the window is a swap, and a
version set by hand stays set."""

from __future__ import annotations

import logging

import httpx
import pytest

from infercache.clock import ManualClock
from infercache.gateway.stats import gateway_stats
from tests.gateway.conftest import MakeGateway, Running, body

OPENAI_LIKE = ("fp_76f018034d", "fp_c5162df67e", "fp_9c4936e070")
QUESTIONS = [f"question {i}?" for i in range(20)]


def ask(client: httpx.Client, question: str) -> str:
    response = client.post("/v1/chat/completions", json=body(question))
    assert response.status_code == 200
    return response.headers["x-infercache"]


def version_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "infercache.gateway.versions"]


def rounds(running: Running, questions: list[str], times: int) -> list[str]:
    with running.client() as client:
        return [ask(client, q) for _ in range(times) for q in questions]


def test_three_fingerprints_at_random_are_one_model_and_a_fourth_for_good_is_a_swap(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="infercache.gateway.versions")
    clock = ManualClock()
    running = make_gateway(clock=clock)
    running.fake.fingerprints = OPENAI_LIKE
    layers = rounds(running, QUESTIONS, 10)
    assert layers.count("exact-hit") >= 170
    assert set(running.fake.bodies[i]["messages"][-1]["content"] for i in range(20)) == set(
        QUESTIONS
    )
    assert version_lines(caplog) == []
    assert gateway_stats(running.built.gateway)["model_swaps"] == 0

    running.fake.fingerprints = ("fp_new",)  # the provider moved to a new model for good
    with running.client() as client:
        for i in range(20):  # 20 answers over 76 s: past the default window (60 s, 20)
            clock.advance(4.0)
            assert ask(client, f"after the swap {i}") == "miss"
    assert rounds(running, QUESTIONS, 1) == ["miss"] * 20  # the old answers are retired
    assert rounds(running, QUESTIONS, 1) == ["exact-hit"] * 20
    lines = version_lines(caplog)
    assert len(lines) == 1
    assert "now version fp_new" in lines[0]
    versions = gateway_stats(running.built.gateway)["versions"]
    (change,) = versions["changes"]
    assert (change["version"], change["source"]) == ("fp_new", "system_fingerprint")
    assert "displaced" in change["evidence"]
    assert running.built.cache.model_version("test-model") == "fp_new"


def test_a_version_set_by_the_admin_stays_set(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="infercache.gateway.versions")
    clock = ManualClock()
    running = make_gateway(clock=clock, admin_token="adm")
    running.fake.fingerprints = OPENAI_LIKE
    assert rounds(running, QUESTIONS[:5], 2) == ["miss"] * 5 + ["exact-hit"] * 5
    with running.client("adm") as admin:
        answer = admin.post("/admin/model-version", json={"model": "test-model", "version": "v2"})
    assert answer.json()["changed"] is True
    running.fake.fingerprints = ("fp_after_the_upgrade",)
    with running.client() as client:
        for i in range(40):  # the next answers' fingerprints do not undo it
            clock.advance(4.0)
            ask(client, f"later {i}")
    assert running.built.cache.model_version("test-model") == "v2"
    assert rounds(running, QUESTIONS[:5], 2) == ["miss"] * 5 + ["exact-hit"] * 5
    assert len(version_lines(caplog)) == 1  # the admin's change, once
    assert gateway_stats(running.built.gateway)["model_swaps"] == 1
