"""Real engines behind the gateway: vLLM and SGLang upstreams get a per-tenant `cache_salt`
the gateway sets itself (a client's never reaches them)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infercache.gateway.config import UpstreamSpec
from tests.gateway.conftest import MakeGateway, Running, body

KEYS = {"sk-a": "team-a", "sk-b": "team-b"}


def post(running: Running, key: str, payload: dict[str, Any]) -> None:
    with running.client(key) as client:
        assert client.post("/v1/chat/completions", json=payload).status_code == 200


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_each_tenant_gets_its_own_stable_cache_salt_and_a_clients_never_passes(
    make_gateway: MakeGateway, fake: tuple[Any, str], kind: str
) -> None:
    upstream, url = fake
    upstream.models_version = "weights-1"  # read before the first request, as vLLM's would be
    running = make_gateway(api_keys=KEYS, upstreams=(UpstreamSpec.parse(f"{url}/v1,kind={kind}"),))
    post(running, "sk-a", body("one", cache_salt="chosen-by-the-client"))
    post(running, "sk-a", body("two", stream=True))
    post(running, "sk-b", body("one", cache_salt="chosen-by-the-client"))
    post(running, "sk-b", body("three"))
    salts = [b.get("cache_salt") for b in running.fake.bodies]
    assert all(isinstance(s, str) and len(s) >= 16 for s in salts)
    assert salts[0] == salts[1] != salts[2] == salts[3]
    assert "chosen-by-the-client" not in salts
    # A new version on the replica: another salt, so no KV of the old weights is reused.
    upstream.models_version = "weights-2"
    prober = running.built.gateway.prober
    assert prober is not None
    asyncio.run_coroutine_threadsafe(prober.round(), running.built.app.state.loop).result(30)
    post(running, "sk-a", body("four"))
    assert running.fake.bodies[-1]["cache_salt"] not in salts


def test_an_openai_kind_upstream_gets_no_cache_salt(make_gateway: MakeGateway) -> None:
    running = make_gateway(api_keys=KEYS)
    post(running, "sk-a", body("one", cache_salt="chosen-by-the-client"))
    assert "cache_salt" not in running.fake.bodies[0]


def test_the_salt_secret_can_be_shared_by_every_gateway_of_a_deployment(
    make_gateway: MakeGateway, fake: tuple[Any, str]
) -> None:
    _, url = fake
    spec = (UpstreamSpec.parse(f"{url}/v1,kind=vllm"),)
    environ = {"INFERCACHE_CACHE_SALT_SECRET": "one secret for the deployment"}
    first = make_gateway(api_keys=KEYS, upstreams=spec, environ=environ)
    second = make_gateway(api_keys=KEYS, upstreams=spec, environ=environ)
    post(first, "sk-a", body("first gateway"))
    post(second, "sk-a", body("second gateway"))
    salts = [b["cache_salt"] for b in first.fake.bodies]
    assert salts[0] == salts[1]


@pytest.mark.parametrize("stream", [False, True])
def test_an_overloaded_upstream_429_passes_through_with_retry_after_and_stores_nothing(
    make_gateway: MakeGateway, stream: bool
) -> None:
    running = make_gateway()
    running.fake.fail_status = 429
    with running.client() as client:
        refused = client.post("/v1/chat/completions", json=body("busy", stream=stream))
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "7"
    assert refused.json()["error"]["message"] == "slow down"
    running.fake.fail_status = None
    with running.client() as client:
        again = client.post("/v1/chat/completions", json=body("busy"))
    assert again.headers["x-infercache"] == "miss"  # the refusal was never stored
    assert running.built.gateway.router.health() == ["healthy"]  # a 429 is no replica fault
