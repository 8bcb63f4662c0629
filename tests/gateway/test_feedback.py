"""`POST /v1/feedback` through a real gateway on loopback (issue 11, acceptance 4): an answer
reported wrong is never served again; another tenant's report on it is refused with 404 in the
OpenAI error shape and the entry stays; bad bodies are 400s; `/stats` and `/metrics` count the
complaints per layer that answered."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from infercache.semantic.embedder import HashingEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.layer import SemanticConfig
from tests.gateway.conftest import MakeGateway, Running, body

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
ADMIN = "adm-1"


def ask(running: Running, key: str, content: str, **fields: Any) -> httpx.Response:
    with running.client(key) as client:
        reply = client.post("/v1/chat/completions", json=body(content, **fields))
    assert reply.status_code == 200, reply.text
    return reply


def report(running: Running, key: str | None, payload: Any) -> httpx.Response:
    with running.client(key) as client:
        return client.post("/v1/feedback", json=payload)


def stats(running: Running) -> dict[str, Any]:
    with running.client(ADMIN) as client:
        out: dict[str, Any] = client.get("/stats").json()
    return out


@pytest.fixture
def running(make_gateway: MakeGateway) -> Running:
    return make_gateway(api_keys=KEYS, admin_token=ADMIN)


def test_another_tenants_report_is_a_404_and_the_entry_stays(running: Running) -> None:
    first = ask(running, "sk-acme", "What is 2+2?")
    answer_id = first.json()["id"]
    refused = report(running, "sk-globex", {"id": answer_id, "wrong": True})
    assert refused.status_code == 404
    error = refused.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "id",
        "not_found",
    )
    again = ask(running, "sk-acme", "What is 2+2?")
    assert again.headers["x-infercache"] == "exact-hit"
    assert again.json()["id"] == answer_id
    assert stats(running)["feedback"]["complaints"] == {"semantic": 0, "exact": 0, "fetched": 0}


def test_a_reported_exact_hit_is_never_served_again(running: Running) -> None:
    ask(running, "sk-acme", "What is 2+2?")
    hit = ask(running, "sk-acme", "What is 2+2?")
    assert hit.headers["x-infercache"] == "exact-hit"
    wrong_id = hit.json()["id"]

    accepted = report(running, "sk-acme", {"id": wrong_id, "wrong": True})
    assert accepted.status_code == 200
    assert accepted.json() == {"object": "feedback", "id": wrong_id, "wrong": True, "retired": True}
    for _ in range(2):
        later = ask(running, "sk-acme", "What is 2+2?")
        assert later.json()["id"] != wrong_id
    assert running.fake.calls == 2
    assert report(running, "sk-acme", {"id": wrong_id, "wrong": True}).status_code == 200
    assert stats(running)["feedback"]["complaints"]["exact"] == 1  # a repeat counts once


def test_a_reported_semantic_hit_is_never_served_again_and_is_counted(running: Running) -> None:
    running.built.cache.enable_semantic(
        HashingEmbedder(dim=512), config=SemanticConfig(threshold=0.7), guards=default_guards()
    )
    original = ask(running, "sk-acme", "How do I reset my password?")
    streamed = ask(running, "sk-acme", "How can I reset my password?", stream=True)
    assert streamed.headers["x-infercache"] == "semantic-hit"
    events = [e.removeprefix("data: ") for e in streamed.text.split("\n\n") if e]
    wrong_id = original.json()["id"]
    assert {json.loads(e)["id"] for e in events[:-1]} == {wrong_id}  # what a stream shows

    assert report(running, "sk-globex", {"id": wrong_id, "wrong": True}).status_code == 404
    still = ask(running, "sk-acme", "How can I reset my password?")
    assert still.headers["x-infercache"] == "semantic-hit"  # another tenant changed nothing

    assert report(running, "sk-acme", {"id": wrong_id, "wrong": True}).status_code == 200
    for text in ("How can I reset my password?", "How do I reset my password?"):
        later = ask(running, "sk-acme", text)
        assert later.json()["id"] != wrong_id
    feedback = stats(running)["feedback"]
    assert feedback["complaints"] == {"semantic": 1, "exact": 0, "fetched": 0}
    with running.client(ADMIN) as client:
        metrics = client.get("/metrics").text
    lines = [line for line in metrics.splitlines() if "complaints" in line and "semantic" in line]
    assert len(lines) == 1
    assert lines[0].endswith(" 1.0")


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (["chatcmpl-1"], None),
        ({"wrong": True}, "id"),
        ({"id": "", "wrong": True}, "id"),
        ({"id": 7, "wrong": True}, "id"),
        ({"id": "chatcmpl-1"}, "wrong"),
        ({"id": "chatcmpl-1", "wrong": "yes"}, "wrong"),
    ],
)
def test_bad_bodies_are_400s_in_the_openai_shape(
    running: Running, payload: Any, param: str | None
) -> None:
    reply = report(running, "sk-acme", payload)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


def test_feedback_needs_the_same_key_as_chat_and_only_post(running: Running) -> None:
    assert report(running, None, {"id": "x", "wrong": True}).status_code == 401
    assert report(running, "sk-nobody", {"id": "x", "wrong": True}).status_code == 401
    with running.client("sk-acme") as client:
        assert client.get("/v1/feedback").status_code == 405  # the gateway's own path
        raw = client.post("/v1/feedback", content=b"{not json")
    assert raw.status_code == 400
    assert running.fake.other_requests == []  # never passed through


def test_positive_feedback_is_accepted_and_changes_nothing(running: Running) -> None:
    first = ask(running, "sk-acme", "What is 2+2?")
    thanks = report(running, "sk-acme", {"id": first.json()["id"], "wrong": False})
    assert thanks.status_code == 200
    assert thanks.json()["retired"] is False
    assert ask(running, "sk-acme", "What is 2+2?").headers["x-infercache"] == "exact-hit"
