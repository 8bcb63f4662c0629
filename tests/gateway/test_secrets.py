"""No secret leaves the gateway: gateway keys never reach the upstream, and planted passwords and
keys appear in no /stats, /metrics, log line, error body or ready line."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infercache.errors import ConfigError
from infercache.gateway.config import GatewayConfig, UpstreamSpec
from infercache.urls import mask_credentials
from tests.conftest import RedisServer, start_redis
from tests.gateway.conftest import MakeGateway, Running, body
from tests.harness.processes import start, stop
from tests.harness.servers import free_port

PASSWORD = "pl4nted-Redis-pass"
UPSTREAM_PASSWORD = "pl4nted-upstream-pass"
UPSTREAM_KEY = "sk-pl4nted-upstream-key"
CLIENT_KEYS = {"sk-pl4nted-client-a": "team-a", "sk-pl4nted-client-b": "team-b"}
ADMIN = "adm-pl4nted-token"
SECRETS = (PASSWORD, UPSTREAM_PASSWORD, UPSTREAM_KEY, ADMIN, *CLIENT_KEYS)


def post(running: Running, key: str | None, payload: Any = None) -> httpx.Response:
    with running.client(key) as client:
        return client.post("/v1/chat/completions", json=payload or body())


def authorization_sent(running: Running) -> list[str | None]:
    return [h.get("authorization") for h in running.fake.headers]


def with_credentials(url: str, user: str, password: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{user}:{password}@{rest}"


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server that requires the planted password."""
    with start_redis(tmp_path_factory.mktemp("locked-redis")) as server:
        subprocess.run(
            ["redis-cli", "-p", str(server.port), "config", "set", "requirepass", PASSWORD],
            check=True,
            capture_output=True,
        )
        yield server


def test_gateway_keys_never_reach_the_upstream(make_gateway: MakeGateway) -> None:
    running = make_gateway(api_keys=CLIENT_KEYS)
    assert post(running, "sk-pl4nted-client-a").status_code == 200
    assert authorization_sent(running) == [None]


# Where clients put keys: the standard ones, the Anthropic and Azure SDKs', a proxy's, cookies,
# other vendors' and gateways', and two whose names are allowed (a value scan must catch them).
PLANTED_HEADERS = (
    "authorization", "x-api-key", "api-key", "proxy-authorization", "cookie", "x-goog-api-key",
    "x-auth-token", "x-access-token", "apikey", "ocp-apim-subscription-key",
    "openai-organization", "x-stainless-planted",
)  # fmt: skip
AUTH_HEADERS = ("authorization", "x-api-key", "api-key")  # what the gateway reads a key from


def _planted(name: str, key: str) -> str:
    if name in ("authorization", "proxy-authorization"):
        return f"Bearer {key}"
    return f"session={key}" if name == "cookie" else key


@pytest.mark.parametrize("mode", ["key", "open"])
def test_a_planted_gateway_key_never_reaches_the_upstream_in_any_header_or_query(
    make_gateway: MakeGateway, fake: tuple[Any, str], mode: str
) -> None:
    """The key in each of 12 header names and in the query, to chat, embeddings, Anthropic's
    messages (translated to chat), OpenAI's responses (sent natively) and two pass-through
    paths: nothing the upstream received holds it; its own key is always sent."""
    _, upstream_url = fake
    key = "sk-pl4nted-client-a"
    running = make_gateway(
        api_keys=CLIENT_KEYS if mode == "key" else {},
        upstreams=(UpstreamSpec(f"{upstream_url}/v1", key_env="STANDIN_KEY"),),
        environ={"STANDIN_KEY": UPSTREAM_KEY},
    )
    calls = (
        ("POST", "/v1/chat/completions", body()),
        ("POST", "/v1/embeddings", {"model": "e", "input": ["a", "b"]}),
        ("GET", "/v1/files", None),
        ("POST", "/v1/responses", {"model": "test-model", "input": "hi"}),
        (
            "POST",
            "/v1/messages",
            {
                "model": "test-model",
                "max_tokens": 9,
                "temperature": 0,
                "messages": [{"role": "user", "content": "hi"}],
            },
        ),
        ("POST", "/v1/batches", {"input_file_id": "file-1"}),
    )
    with httpx.Client(base_url=running.url, timeout=30) as client:
        for i, name in enumerate(PLANTED_HEADERS):
            auth = AUTH_HEADERS[i % len(AUTH_HEADERS)]  # the key is presented in each of them
            headers = {auth: _planted(auth, key), name: _planted(name, key)}
            for method, path, payload in calls:
                response = client.request(
                    method,
                    path,
                    params={"api-key": key, "limit": "2", "q": key},
                    headers=headers,
                    json=payload,
                )
                assert response.status_code == 200, (name, path, response.text)
    received = running.fake.received
    # chat, embeddings and messages hit after one; the stand-in's responses answer is not a
    # completed response, so it is never stored: it and the two pass-throughs reach it each time
    assert len(received) == 3 + 3 * len(PLANTED_HEADERS)
    for request in received:
        assert key.encode() not in request
        assert f"authorization: Bearer {UPSTREAM_KEY}".encode() in request
    passed = [r for r in received if r.startswith(b"GET\n/v1/files")]
    assert len(passed) == len(PLANTED_HEADERS)
    assert all(b"\nlimit=2\n" in r for r in passed)  # other parameters are kept


def test_a_header_forwarded_on_purpose_passes_but_never_a_credential_header(
    make_gateway: MakeGateway, fake: tuple[Any, str]
) -> None:
    _, upstream_url = fake
    running = make_gateway(forward_headers=("X-Trace-Id",))
    with httpx.Client(base_url=running.url, timeout=30) as client:
        headers = {"x-trace-id": "t-1", "x-other": "o-1", "openai-beta": "assistants=v2"}
        assert client.get("/v1/files", headers=headers).status_code == 200
    sent = running.fake.other_requests[-1]["headers"]
    assert (sent.get("x-trace-id"), sent.get("openai-beta")) == ("t-1", "assistants=v2")
    assert "x-other" not in sent
    with pytest.raises(ConfigError, match="credential header"):
        GatewayConfig(upstreams=(f"{upstream_url}/v1",), forward_headers=("X-Api-Key",))


def test_the_anthropic_and_azure_key_headers_authenticate(make_gateway: MakeGateway) -> None:
    running = make_gateway(api_keys=CLIENT_KEYS)
    with httpx.Client(base_url=running.url, timeout=30) as client:
        for name in ("x-api-key", "api-key"):
            headers = {name: "sk-pl4nted-client-b"}
            answer = client.post("/v1/chat/completions", json=body(), headers=headers)
            assert answer.status_code == 200
            wrong = client.post("/v1/chat/completions", json=body(), headers={name: "sk-no"})
            assert wrong.status_code == 401
    assert running.fake.calls == 1  # one tenant: the second is a hit


def test_an_upstream_gets_its_own_key_from_its_key_env(
    make_gateway: MakeGateway, fake: tuple[Any, str]
) -> None:
    _, upstream_url = fake
    running = make_gateway(
        api_keys=CLIENT_KEYS,
        upstreams=(UpstreamSpec(f"{upstream_url}/v1", key_env="STANDIN_KEY"),),
        environ={"STANDIN_KEY": UPSTREAM_KEY},
    )
    post(running, "sk-pl4nted-client-b")
    assert authorization_sent(running) == [f"Bearer {UPSTREAM_KEY}"]


def test_an_unset_key_env_is_refused_at_start(fake: tuple[Any, str]) -> None:
    _, upstream_url = fake
    config = GatewayConfig(upstreams=(UpstreamSpec.parse(f"{upstream_url},key_env=NOPE"),))
    with pytest.raises(ConfigError, match=r"\$NOPE"):
        config.with_env({})


def test_open_mode_forwards_the_callers_bearer_only_when_asked(
    make_gateway: MakeGateway, fake: tuple[Any, str]
) -> None:
    _, upstream_url = fake
    quiet = make_gateway()
    post(quiet, "sk-callers-own")
    assert authorization_sent(quiet) == [None]
    forwarding = make_gateway(forward_client_key=True)
    post(forwarding, "sk-callers-own", body("another question"))
    assert authorization_sent(forwarding)[-1] == "Bearer sk-callers-own"
    with pytest.raises(ConfigError, match="open mode"):
        GatewayConfig(
            upstreams=(f"{upstream_url}/v1",), api_keys=CLIENT_KEYS, forward_client_key=True
        )


def test_url_credentials_become_basic_auth_even_beside_a_client_bearer(
    make_gateway: MakeGateway, fake: tuple[Any, str]
) -> None:
    _, upstream_url = fake
    running = make_gateway(
        upstreams=(with_credentials(f"{upstream_url}/v1", "svc", UPSTREAM_PASSWORD),)
    )
    response = post(running, "sk-some-client")
    assert response.status_code == 200
    expected = base64.b64encode(f"svc:{UPSTREAM_PASSWORD}".encode()).decode()
    assert authorization_sent(running) == [f"Basic {expected}"]


def test_stats_and_metrics_need_a_token_when_keys_are_configured(
    make_gateway: MakeGateway,
) -> None:
    running = make_gateway(api_keys=CLIENT_KEYS, admin_token=ADMIN, metrics_token="m-token")
    with running.client() as anonymous, running.client("sk-pl4nted-client-a") as tenant:
        for client, status in ((anonymous, 401), (tenant, 403)):
            assert client.get("/stats").status_code == status
            assert client.get("/metrics").status_code == status
    with running.client(ADMIN) as admin, running.client("m-token") as scraper:
        assert admin.get("/stats").status_code == 200
        assert scraper.get("/metrics").status_code == 200
        assert admin.get("/metrics").status_code == 200
        assert scraper.get("/stats").status_code == 401


def test_no_planted_secret_shows_anywhere(
    make_gateway: MakeGateway,
    fake: tuple[Any, str],
    locked_redis: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, upstream_url = fake
    store = with_credentials(locked_redis.url(), "", PASSWORD)
    running = make_gateway(
        store_url=store,
        api_keys=CLIENT_KEYS,
        admin_token=ADMIN,
        upstreams=(with_credentials(f"{upstream_url}/v1", "svc", UPSTREAM_PASSWORD),),
    )
    dead = make_gateway(
        api_keys=CLIENT_KEYS,
        upstreams=(
            with_credentials(f"http://127.0.0.1:{free_port()}/v1", "svc", UPSTREAM_PASSWORD),
        ),
    )
    seen: list[str] = []
    for key in CLIENT_KEYS:
        for _ in range(2):  # a miss, then a hit through the password-protected store
            response = post(running, key)
            assert response.status_code == 200
            seen.append(response.text + str(response.headers))
    assert post(running, "sk-pl4nted-client-a").headers["x-infercache"] == "exact-hit"
    seen.append(post(running, "sk-wrong").text)  # 401
    seen.append(post(running, "sk-pl4nted-client-a", {"model": 3}).text)  # 400
    unreachable = post(dead, "sk-pl4nted-client-a")
    assert unreachable.status_code == 502
    seen.append(unreachable.text)
    running.fake.fail_status = 500
    seen.append(post(running, "sk-pl4nted-client-a", body("fails upstream")).text)
    with running.client(ADMIN) as admin:
        stats = admin.get("/stats")
        metrics = admin.get("/metrics")
    assert stats.json()["store"]["url"] == mask_credentials(store)
    assert "***" in stats.text
    seen += [stats.text, metrics.text, caplog.text]
    for text in seen:
        for secret in SECRETS:
            assert secret not in text


def test_the_ready_line_masks_credentials(
    tmp_path: Path, fake: tuple[Any, str], locked_redis: RedisServer
) -> None:
    _, upstream_url = fake
    port = free_port()
    process, ready = start(
        [
            "serve", "--port", str(port),
            "--store", with_credentials(locked_redis.url(), "", PASSWORD),
            "--upstream", with_credentials(f"{upstream_url}/v1", "svc", UPSTREAM_PASSWORD),
            "--api-key", f"{next(iter(CLIENT_KEYS))}=team-a", "--admin-token", ADMIN,
        ],
        "gateway ready",
        on_stderr=False,
        env={"INFERCACHE_DATA_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            headers = {"authorization": f"Bearer {next(iter(CLIENT_KEYS))}"}
            answer = client.post("/v1/chat/completions", json=body(), headers=headers)
        assert answer.status_code == 200
    finally:
        out, err = stop(process)
    assert "***" in ready
    for secret in SECRETS:
        assert secret not in ready + out + err
