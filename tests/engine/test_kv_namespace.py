"""The one KV namespace rule (engine/kv_namespace.py), asked by the engine and the analyzer."""

from __future__ import annotations

import pytest

from infercache.engine.kv_namespace import kv_namespace, logged_namespace


def test_tenants_models_and_salts_each_split_the_namespace() -> None:
    base = kv_namespace("a", model="m")
    assert base != kv_namespace("b", model="m")
    assert base != kv_namespace("a", model="m2")
    assert base != kv_namespace("a", model="m", cache_salt="s")
    assert kv_namespace("a", model="m", cache_salt="s") != kv_namespace(
        "a", model="m", cache_salt="t"
    )
    assert kv_namespace(None, model="m") == kv_namespace("", model="m")


def test_sharing_across_tenants_joins_tenants_but_keeps_salts_apart() -> None:
    assert kv_namespace("a", model="m", share_across_tenants=True) == kv_namespace(
        "b", model="m", share_across_tenants=True
    )
    assert kv_namespace("a", model="m", cache_salt="x", share_across_tenants=True) != (
        kv_namespace("b", model="m", share_across_tenants=True)
    )


@pytest.mark.parametrize(
    ("tenant", "salt"), [('a", "m', None), ("a", '", "m'), ("shared", None), ("", "")]
)
def test_no_tenant_or_salt_spells_another_namespace(tenant: str, salt: str | None) -> None:
    spelled = kv_namespace(tenant, model="m", cache_salt=salt)
    assert spelled != kv_namespace("a", model="m")
    assert spelled != kv_namespace("x", model="m", share_across_tenants=True)


def test_a_logged_body_is_namespaced_by_its_salt_as_the_engine_does() -> None:
    body = {"model": "m", "messages": [], "cache_salt": "s1"}
    assert logged_namespace("t", "m", body, share_across_tenants=False) == kv_namespace(
        "t", model="m", cache_salt="s1"
    )
    # A salt the engine would refuse (not a non-empty string) never keyed any KV.
    for bad in ("", 7, None):
        odd = {**body, "cache_salt": bad}
        assert logged_namespace("t", "m", odd, share_across_tenants=False) == kv_namespace(
            "t", model="m"
        )
    assert logged_namespace("t", "m", None, share_across_tenants=False) == kv_namespace(
        "t", model="m"
    )
