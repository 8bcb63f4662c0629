"""The gateway over a real loopback HTTP hop to a stand-in provider: layers, headers, streams,
coalescing, tenancy, admin, swap detection, errors and the request log."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import start_redis
from tests.gateway.conftest import MakeGateway, Running, body

ZERO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def post(running: Running, payload: Any, key: str | None = None, **kw: Any) -> httpx.Response:
    with running.client(key) as client:
        return client.post("/v1/chat/completions", json=payload, **kw)


def sse_events(raw: bytes) -> list[str]:
    """The `data:` payloads of an SSE body, checking the framing byte for byte."""
    text = raw.decode()
    assert text.endswith("\n\n"), "every event ends with a blank line"
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


def wait_until(running: Running, condition: Any, attempts: int = 20_000) -> None:
    """Poll /stats (a real request each time) until `condition(stats)` holds."""
    with running.client() as client:
        for _ in range(attempts):
            if condition(client.get("/stats").json()):
                return
    pytest.fail("condition never held")


def two_on_one_flight(running: Running, payload: dict[str, Any]) -> list[httpx.Response]:
    """`payload` asked twice at once while the upstream is held, so that both requests are on
    one flight (one leads, one waits); the answers once released, after one upstream call."""
    running.fake.hold()
    answers: list[httpx.Response] = []

    def ask() -> None:
        with running.client() as client:
            answers.append(client.post("/v1/chat/completions", json=payload))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(running, lambda stats: stats["waiting"] == 1)  # both on the one flight
    running.fake.release()
    for t in threads:
        t.join(30)
    assert running.fake.calls == 1
    return answers


def test_a_repeat_is_an_exact_hit_with_an_age(make_gateway: MakeGateway) -> None:
    # hit_usage "original": the stored answer as it is (the default reports the usage as
    # saved: tests/gateway/test_hit_usage.py)
    running = make_gateway(settings={"hit_usage": "original"})
    first = post(running, body())
    second = post(running, body())
    assert first.status_code == second.status_code == 200
    assert first.headers["x-infercache"] == "miss"
    assert second.headers["x-infercache"] == "exact-hit"
    assert int(second.headers["age"]) >= 0
    assert second.json() == first.json()
    # The hit replays the stored JSON as is: the very bytes the miss answered with.
    assert second.content == first.content
    assert second.headers["content-length"] == str(len(first.content))
    assert running.fake.calls == 1


def test_the_openai_client_gets_hits_through_the_gateway(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    client = openai.OpenAI(api_key="sk-any", base_url=f"{running.url}/v1")
    messages = body()["messages"]
    first = client.chat.completions.with_raw_response.create(
        model="test-model", messages=messages, temperature=0
    )
    second = client.chat.completions.with_raw_response.create(
        model="test-model", messages=messages, temperature=0
    )
    assert first.headers["x-infercache"] == "miss"
    assert second.headers["x-infercache"] == "exact-hit"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    client.close()


def test_a_streamed_hit_replays_a_valid_openai_sse_sequence(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    # Without configured keys, the bearer token is the tenant: same token as the client below.
    stored = post(running, body(), key="sk-any").json()
    replay = post(running, body(stream=True, stream_options={"include_usage": True}), key="sk-any")
    assert replay.headers["x-infercache"] == "exact-hit"
    assert replay.headers["content-type"].startswith("text/event-stream")
    events = sse_events(replay.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == stored["choices"][0]["message"]["content"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop"
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1]["choices"] == []
    # a hit's usage as hit_usage "zero" (the default) says it: nothing billed, the original's
    # tokens in the header as saved
    assert chunks[-1]["usage"] == {**ZERO_USAGE, "prompt_tokens_details": {"cached_tokens": 0}}
    saved = stored["usage"]
    assert replay.headers["x-infercache-saved-tokens"] == (
        f"prompt={saved['prompt_tokens']}, completion={saved['completion_tokens']}"
    )
    # and the official client parses it
    client = openai.OpenAI(api_key="sk-any", base_url=f"{running.url}/v1")
    stream = client.chat.completions.create(
        model="test-model", messages=body()["messages"], temperature=0, stream=True
    )
    parsed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert parsed == text
    client.close()


def test_a_stream_is_stored_and_serves_a_non_streaming_request(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    streamed = post(running, body(stream=True))
    assert streamed.headers["x-infercache"] == "miss"
    events = sse_events(streamed.content)
    assert events[-1] == "[DONE]"
    assert all("usage" not in json.loads(e) for e in events[:-1])  # not asked for
    plain = post(running, body())
    assert plain.headers["x-infercache"] == "exact-hit"
    text = "".join(
        json.loads(e)["choices"][0]["delta"].get("content") or ""
        for e in events[:-1]
        if json.loads(e)["choices"]
    )
    assert plain.json()["choices"][0]["message"]["content"] == text
    assert plain.headers["x-infercache-saved-tokens"] == "prompt=30, completion=6"  # stored
    assert running.fake.calls == 1


def test_an_aborted_stream_is_not_stored(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    running.fake.hold()  # the upstream sends its first chunk, then waits
    with (
        running.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body(stream=True)) as response,
    ):
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    # The client hung up mid-answer: the gateway drops the upstream stream, stores nothing.
    wait_until(running, lambda stats: stats["flights"] == 0)
    running.fake.release()
    again = post(running, body())
    assert again.headers["x-infercache"] == "miss"
    assert running.exact()["counters"].get("stored", 0) == 1  # only the second answer


@pytest.mark.concurrency
def test_twenty_concurrent_identical_requests_make_one_upstream_call(
    make_gateway: MakeGateway,
) -> None:
    running = make_gateway()
    running.fake.hold()
    results: list[tuple[str, str]] = []
    lock = threading.Lock()

    def call(stream: bool) -> None:
        response = post(running, body(stream=stream))
        assert response.status_code == 200
        if stream:
            events = sse_events(response.content)
            assert events[-1] == "[DONE]"
            text = "".join(
                json.loads(e)["choices"][0]["delta"].get("content") or ""
                for e in events[:-1]
                if json.loads(e)["choices"]
            )
        else:
            text = response.json()["choices"][0]["message"]["content"]
        with lock:
            results.append((response.headers["x-infercache"], text))

    threads = [threading.Thread(target=call, args=(i % 2 == 0,)) for i in range(20)]
    for t in threads:
        t.start()
    # Release the upstream once all 20 are attached to the one flight in the gateway.
    wait_until(running, lambda stats: stats["waiting"] == 19)
    running.fake.release()
    for t in threads:
        t.join(30)
    assert running.fake.calls == 1
    assert len(results) == 20
    assert len({text for _, text in results}) == 1
    assert sorted(h for h, _ in results).count("miss") == 1
    assert running.exact()["counters"]["coalesced"] == 19


def test_tenants_never_see_each_others_answers(make_gateway: MakeGateway) -> None:
    running = make_gateway(api_keys={"key-a": "tenant-a", "key-b": "tenant-b"})
    a = post(running, body(), key="key-a")
    b = post(running, body(), key="key-b")
    assert (a.headers["x-infercache"], b.headers["x-infercache"]) == ("miss", "miss")
    assert a.json()["id"] != b.json()["id"]
    # A body or header claiming another tenant only narrows the key's own: never tenant-a.
    spoof = post(running, body(infercache={"tenant": "tenant-a"}), key="key-b")
    spoof_header = post(running, body(), key="key-b", headers={"x-infercache-tenant": "tenant-a"})
    assert spoof.headers["x-infercache"] == "miss"
    assert spoof_header.headers["x-infercache"] == "exact-hit"  # the same sub-namespace
    assert spoof.json()["id"] == spoof_header.json()["id"] not in (a.json()["id"], b.json()["id"])
    tenants = [h["x-infercache-tenant"] for h in running.fake.headers]
    assert tenants == ["tenant-a", "tenant-b", "tenant-b/tenant-a"]


def test_auth_errors_are_401_in_openai_shape(make_gateway: MakeGateway) -> None:
    running = make_gateway(api_keys={"key-a": "tenant-a"})
    for key in (None, "wrong"):
        r = post(running, body(), key=key)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    assert running.fake.calls == 0


def test_admin_invalidate_and_model_version(make_gateway: MakeGateway) -> None:
    running = make_gateway(api_keys={"key-a": "tenant-a"}, admin_token="admin-secret")
    tagged = body("pricing?", infercache={"tags": ["kb:pricing"]})
    plain = body("plain?")
    post(running, tagged, key="key-a")
    post(running, plain, key="key-a")
    with running.client("key-a") as client:
        assert client.post("/admin/invalidate", json={"tags": ["kb:pricing"]}).status_code == 403
    with running.client() as client:
        assert client.post("/admin/invalidate", json={"tags": ["kb:pricing"]}).status_code == 401
    with running.client("admin-secret") as admin:
        r = admin.post("/admin/invalidate", json={"tags": ["kb:pricing"]})
        assert r.status_code == 200
        assert r.json() == {"invalidated_tags": 1}
        assert admin.post("/admin/invalidate", json={"tags": "oops"}).status_code == 400
    assert post(running, tagged, key="key-a").headers["x-infercache"] == "miss"
    assert post(running, plain, key="key-a").headers["x-infercache"] == "exact-hit"
    with running.client("admin-secret") as admin:
        r = admin.post("/admin/model-version", json={"model": "test-model", "version": "v2"})
        assert r.json()["changed"] is True
    assert post(running, plain, key="key-a").headers["x-infercache"] == "miss"


def test_a_version_in_v1_models_is_picked_up_by_polling(make_gateway: MakeGateway) -> None:
    running = make_gateway(use_fingerprints=False)
    post(running, body())
    running.fake.models_version = "weights-abc"
    loop = running.built.app.state.loop  # poll on the gateway's own loop, as its timer does
    prober = running.built.gateway.prober
    assert prober is not None
    asyncio.run_coroutine_threadsafe(prober.round(), loop).result(30)
    assert running.built.cache.model_version("test-model") == "weights-abc"
    assert post(running, body()).headers["x-infercache"] == "miss"


@pytest.mark.parametrize(
    ("payload", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (json.dumps(body(temperature="hot")).encode(), 400, "temperature"),
        (json.dumps(body(max_tokens=-1)).encode(), 400, "max_tokens"),
        (json.dumps({"model": "test-model"}).encode(), 400, "messages"),
        (json.dumps(body(infercache={"ttl_s": "long"})).encode(), 400, "infercache.ttl_s"),
    ],
)
def test_malformed_requests_get_openai_shaped_400s_and_nothing_is_stored(
    make_gateway: MakeGateway, payload: bytes, status: int, param: str | None
) -> None:
    running = make_gateway()
    r = post(running, None, content=payload, headers={"content-type": "application/json"})
    assert r.status_code == status
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert "Traceback" not in r.text
    assert running.fake.calls == 0
    assert post(running, body()).status_code == 200  # still serving


def test_oversize_bodies_get_413(make_gateway: MakeGateway) -> None:
    running = make_gateway(max_body_bytes=4096)
    r = post(running, body("x" * 10_000))
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"
    assert running.fake.calls == 0


def test_unknown_routes_and_methods_are_openai_shaped(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    with running.client() as client:
        missing = client.get("/nope")  # (an unknown /v1 path goes to the upstream)
        wrong = client.get("/v1/chat/completions")
    assert missing.status_code == 404
    assert wrong.status_code == 405
    assert "error" in missing.json()
    assert "error" in wrong.json()


def test_upstream_errors_pass_through_and_are_never_cached(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    running.fake.fail_status = 429
    r = post(running, body())
    assert r.status_code == 429
    assert r.json()["error"]["message"] == "slow down"
    streamed = post(running, body(stream=True))
    assert streamed.status_code == 429
    running.fake.fail_status = None
    assert post(running, body()).headers["x-infercache"] == "miss"


def test_an_unreachable_upstream_is_a_502(tmp_path: Path) -> None:
    from infercache.gateway.build import build
    from infercache.gateway.config import GatewayConfig
    from infercache.gateway.upstream import HTTPUpstream
    from infercache.settings import Settings
    from tests.harness.servers import free_port, serve

    dead = f"http://127.0.0.1:{free_port()}/v1"
    built = build(
        Settings(data_dir=tmp_path, store_url="memory://"),
        GatewayConfig(upstreams=(dead,), version_poll_s=None),
        upstreams=[HTTPUpstream(dead)],
    )
    with serve(built.app) as url, httpx.Client(base_url=url) as client:
        r = client.post("/v1/chat/completions", json=body())
        assert r.status_code == 502
        assert "unreachable" in r.json()["error"]["message"]
        assert client.get("/healthz").json() == {"status": "ok"}


def test_cache_control_headers_work_like_the_body_directives(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    assert post(running, body(), headers={"cache-control": "no-store"}).status_code == 200
    assert post(running, body()).headers["x-infercache"] == "miss"
    refreshed = post(running, body(), headers={"cache-control": "no-cache"})
    assert refreshed.headers["x-infercache"] == "bypass"
    assert post(running, body()).json()["id"] == refreshed.json()["id"]
    assert (
        post(running, body("new"), headers={"cache-control": "only-if-cached"}).status_code == 504
    )
    tagged = {"x-infercache-tags": "kb:a", "x-infercache-context": "docs@v1"}
    post(running, body("ctx"), headers=tagged)
    assert post(running, body("ctx"), headers=tagged).headers["x-infercache"] == "exact-hit"
    other_context = {**tagged, "x-infercache-context": "docs@v2"}
    assert post(running, body("ctx"), headers=other_context).headers["x-infercache"] == "miss"
    r = post(running, body(), headers={"cache-control": "max-age=soon"})
    assert r.status_code == 400


def test_a_store_failing_mid_run_degrades_to_counted_misses(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    with start_redis(tmp_path) as redis_server:
        running = make_gateway(store_url=redis_server.url())
        post(running, body())
        assert post(running, body()).headers["x-infercache"] == "exact-hit"
        redis_server.process.kill()  # the store goes away mid-run
        redis_server.process.wait(10)
        for _ in range(3):
            r = post(running, body())
            assert r.status_code == 200
            assert r.headers["x-infercache"] == "miss"
        with running.client() as client:
            stats = client.get("/stats").json()
            prom = client.get("/metrics").text
    misses = stats["strategies"]["exact"]["misses"]
    # Failures open the store's breaker: later lookups skip it (`store_unavailable`).
    assert misses["store_error"] >= 1
    assert misses["store_error"] + misses.get("store_unavailable", 0) == 3
    assert "error" in stats["store"]
    assert 'infercache_misses_total{reason="store_error",strategy="exact"}' in prom


def test_prefix_reuse_reported_by_the_upstream_is_counted(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    post(running, body("first"))
    post(running, body("second"))  # the stand-in reports 16 cached tokens from call 2 on
    r = post(running, body("second"))
    assert r.headers["x-infercache"] == "exact-hit"
    prefix = running.built.cache.stats()["strategies"]["prefix"]
    assert (prefix["lookups"], prefix["hits"], prefix["prompt_tokens_saved"]) == (2, 1, 16)


def test_the_request_log_has_one_line_per_request(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    log_path = tmp_path / "requests.jsonl"
    running = make_gateway(request_log=log_path)
    post(running, body())
    post(running, body())
    post(running, body(stream=True))
    post(running, body(temperature="bad"))
    running.built.gateway.request_log.close()  # type: ignore[union-attr]
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [(r["layer"], r["status"]) for r in lines] == [
        ("miss", 200),
        ("exact-hit", 200),
        ("exact-hit", 200),
        (None, 400),
    ]
    assert lines[0]["request"]["messages"][1]["content"] == "What is 2+2?"
    assert lines[0]["prompt_tokens"] == 30
    assert lines[0]["latency_ms"] > 0
    assert lines[1]["timestamp"] >= lines[0]["timestamp"]


def test_a_redacted_request_log_holds_digests_not_bodies(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    log_path = tmp_path / "redacted.jsonl"
    running = make_gateway(request_log=log_path, redact=True)
    post(running, body("secret question"))
    running.built.gateway.request_log.close()  # type: ignore[union-attr]
    text = log_path.read_text()
    assert "secret question" not in text
    assert json.loads(text)["key_digest"].startswith("hmac-sha256:")  # redaction.py


def test_semantic_hits_are_labelled_with_their_similarity(make_gateway: MakeGateway) -> None:
    from infercache.semantic.embedder import HashingEmbedder
    from infercache.semantic.guards import default_guards
    from infercache.semantic.layer import SemanticConfig

    running = make_gateway()
    running.built.cache.enable_semantic(
        HashingEmbedder(dim=512), config=SemanticConfig(threshold=0.7), guards=default_guards()
    )
    first = post(running, body("How do I reset my password?"))
    again = post(running, body("How can I reset my password?"))
    assert first.headers["x-infercache"] == "miss"
    assert again.headers["x-infercache"] == "semantic-hit"
    assert 0.7 <= float(again.headers["x-infercache-similarity"]) < 1
    assert again.json()["choices"] == first.json()["choices"]
    streamed = post(running, body("How can I reset my password?", stream=True))
    assert streamed.headers["x-infercache"] == "semantic-hit"
    assert sse_events(streamed.content)[-1] == "[DONE]"
    number_flip = post(running, body("How do I reset my password 2?"))
    assert number_flip.headers["x-infercache"] == "miss"
    assert running.fake.calls == 2


def test_requests_sharing_a_prefix_go_to_the_replica_where_it_is_warm(tmp_path: Path) -> None:
    from infercache.gateway.build import build
    from infercache.gateway.config import GatewayConfig
    from infercache.gateway.upstream import HTTPUpstream
    from infercache.settings import Settings
    from tests.harness.servers import serve
    from tests.harness.upstreams import FakeUpstream

    replicas = [FakeUpstream(), FakeUpstream()]
    system_a = "You answer questions about ACME widgets. " * 30
    system_b = "You answer questions about Globex gadgets. " * 30
    with serve(replicas[0].app) as url0, serve(replicas[1].app) as url1:
        built = build(
            Settings(data_dir=tmp_path, store_url="memory://"),
            GatewayConfig(version_poll_s=None),
            upstreams=[HTTPUpstream(f"{url0}/v1"), HTTPUpstream(f"{url1}/v1")],
        )
        with serve(built.app) as url, httpx.Client(base_url=url) as client:
            for i in range(4):
                for system in (system_a, system_b):
                    payload = body(f"question {i}")
                    payload["messages"][0]["content"] = system
                    assert client.post("/v1/chat/completions", json=payload).status_code == 200
    served = [
        {"a" if "ACME" in b["messages"][0]["content"] else "b" for b in r.bodies} for r in replicas
    ]
    # Each system prompt stayed on one replica; with both idle, the two spread out.
    assert sorted(map(sorted, served)) == [["a"], ["b"]]
    assert [r.calls for r in replicas] == [4, 4]


def test_a_stream_cut_off_upstream_ends_with_an_error_event_and_is_not_stored(
    make_gateway: MakeGateway,
) -> None:
    running = make_gateway()
    running.fake.truncate_streams = True
    cut = post(running, body(stream=True))
    events = sse_events(cut.content)
    assert events[-1] != "[DONE]"
    assert "error" in json.loads(events[-1])
    assert running.exact()["counters"].get("stored", 0) == 0
    running.fake.truncate_streams = False
    assert post(running, body()).headers["x-infercache"] == "miss"
