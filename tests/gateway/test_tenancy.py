"""One tenant resolver (auth.resolve_tenant): the key decides, a claim only narrows it, and in
open mode the bearer token does; nobody reaches another's answers by naming them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from infercache.errors import InvalidRequestError
from infercache.gateway.auth import OPEN_TENANT, Caller, resolve_tenant, tenant_of_token
from tests.gateway.conftest import MakeGateway, Running, body


def post(running: Running, payload: Any, key: str | None = None, **headers: str) -> httpx.Response:
    with running.client(key) as client:
        return client.post("/v1/chat/completions", json=payload, headers=headers)


@pytest.mark.parametrize(
    ("caller", "headers", "directive", "tenant"),
    [
        (Caller("acme", "sk-a"), {}, None, "acme"),
        (Caller("acme", "sk-a"), {"x-infercache-tenant": "eu"}, None, "acme/eu"),
        (Caller("acme", "sk-a"), {}, "other", "acme/other"),
        (Caller(None, "sk-a"), {}, None, tenant_of_token("sk-a")),
        (Caller(None, "sk-a"), {}, "x", tenant_of_token("sk-a") + "/x"),
        (Caller(None, None), {}, None, OPEN_TENANT),
        (Caller(None, None), {"x-infercache-tenant": "acme"}, None, "open/acme"),
        # The directive wins over the header, as for every other control.
        (Caller(None, None), {"x-infercache-tenant": "h"}, "d", "open/d"),
    ],
)
def test_the_tenant_is_the_key_narrowed_by_a_claim(
    caller: Caller, headers: dict[str, str], directive: str | None, tenant: str
) -> None:
    payload = body() if directive is None else body(infercache={"tenant": directive})
    assert resolve_tenant(caller, headers, payload) == tenant


def test_a_claim_can_never_produce_another_callers_tenant() -> None:
    victim = tenant_of_token("sk-victim")
    for claim in (victim, "acme", OPEN_TENANT, "", "key:0000"):
        for caller in (Caller(None, None), Caller(None, "sk-attacker"), Caller("eve", "k")):
            resolved = resolve_tenant(caller, {"x-infercache-tenant": claim}, body())
            assert resolved not in (victim, "acme") or claim == ""


@pytest.mark.parametrize("claim", [7, ["a"], {"a": 1}, "x" * 300, "tab\there"])
def test_a_malformed_claim_is_a_400(claim: object) -> None:
    with pytest.raises(InvalidRequestError):
        resolve_tenant(Caller(None, None), {}, body(infercache={"tenant": claim}))


def test_open_mode_separates_bearers_and_refuses_spoofed_tenants(
    make_gateway: MakeGateway,
) -> None:
    running = make_gateway()
    a = post(running, body(), key="sk-a")
    again = post(running, body(), key="sk-a")
    b = post(running, body(), key="sk-b")
    assert [r.headers["x-infercache"] for r in (a, again, b)] == ["miss", "exact-hit", "miss"]
    assert a.json()["id"] == again.json()["id"] != b.json()["id"]
    # Naming sk-a's tenant, by header or directive, with another bearer or none, misses.
    victim = tenant_of_token("sk-a")
    spoofs = [
        post(running, body(), key="sk-b", **{"x-infercache-tenant": victim}),
        post(running, body(), **{"x-infercache-tenant": victim}),
        post(running, body(infercache={"tenant": victim})),
    ]
    assert [s.status_code for s in spoofs] == [200, 200, 200]
    assert all(s.json()["id"] != a.json()["id"] for s in spoofs)
    # The last two both land in the keyless caller's own sub-namespace `open/<claim>`.
    assert [s.headers["x-infercache"] for s in spoofs] == ["miss", "miss", "exact-hit"]


@pytest.mark.parametrize("directives", ["x", 7, ["tenant"], None])
def test_a_non_object_directive_in_open_mode_is_a_400_not_a_500(
    make_gateway: MakeGateway, directives: object
) -> None:
    running = make_gateway()
    response = post(running, {**body(), "infercache": directives})
    if directives is None:
        assert response.status_code == 200
    else:
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "infercache"


def test_a_repeated_header_counts_by_its_first_value(make_gateway: MakeGateway) -> None:
    """As Starlette's `Headers.get` reads it: a second tenant header or API key sent after
    the first changes nothing."""
    running = make_gateway(api_keys={"sk-a": "acme"})
    with httpx.Client(base_url=running.url) as client:
        first = client.post(
            "/v1/chat/completions",
            json=body(),
            headers=[
                ("authorization", "Bearer sk-a"),
                ("authorization", "Bearer sk-wrong"),
                ("x-infercache-tenant", "eu"),
                ("x-infercache-tenant", "us"),
            ],
        )
    assert first.status_code == 200
    eu = post(running, body(), key="sk-a", **{"x-infercache-tenant": "eu"})
    us = post(running, body(), key="sk-a", **{"x-infercache-tenant": "us"})
    assert [r.headers["x-infercache"] for r in (eu, us)] == ["exact-hit", "miss"]
