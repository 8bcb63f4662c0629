"""Prefix-aware routing: a request goes where its prefix is warm, unless that replica is busy."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from infercache.clock import ManualClock
from infercache.gateway.router import PrefixRouter, ReplicaLoad, RouterConfig, block_hashes

SYSTEM = "You are the support assistant of ACME. " * 40  # ~1.6k chars: several blocks


def req(system: str, question: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }


def test_block_hashes_are_a_chain_over_full_blocks() -> None:
    a = block_hashes("x" * 1000, 256)
    b = block_hashes("x" * 512 + "y" * 488, 256)
    assert len(a) == 3  # the 232-char tail is not a full block
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    assert block_hashes("y" + "x" * 999, 256)[1] != a[1]  # a change early changes every block


def test_a_shared_prefix_goes_back_to_the_replica_that_saw_it() -> None:
    router = PrefixRouter(["r0", "r1", "r2"])
    first, matched = router.route("t", req(SYSTEM, "q1"))
    assert matched == 0
    for q in ("q2", "q3", "q4"):
        index, matched = router.route("t", req(SYSTEM, q))
        assert index == first
        assert matched >= 4


def test_unrelated_prompts_spread_by_load() -> None:
    router = PrefixRouter(["r0", "r1"])
    with router.lease("t", req("alpha " * 300, "q")) as a:
        b, _ = router.route("t", req("beta " * 300, "q"))
    assert b != a


def test_tenants_do_not_share_warmth() -> None:
    router = PrefixRouter(["r0", "r1"])
    router.route("tenant-a", req(SYSTEM, "q"))
    _, matched = router.route("tenant-b", req(SYSTEM, "q"))
    assert matched == 0


def test_an_overloaded_warm_replica_is_skipped() -> None:
    router = PrefixRouter(["r0", "r1"], RouterConfig(imbalance_abs=1, imbalance_rel=1.5))
    warm, _ = router.route("t", req(SYSTEM, "q0"))
    with contextlib.ExitStack() as held:
        for i in range(2):  # warm until in flight - the idle one's > imbalance_abs
            assert held.enter_context(router.lease("t", req(SYSTEM, f"warm {i}"))) == warm
        index, _ = router.route("t", req(SYSTEM, "q1"))
        assert index != warm
        assert router.in_flight()[warm] == 2
    assert router.in_flight() == [0, 0]  # every lease gave its count back


def test_a_lease_is_returned_when_the_call_fails() -> None:
    router = PrefixRouter(["r0", "r1"])
    with pytest.raises(RuntimeError), router.lease("t", req(SYSTEM, "q")):
        raise RuntimeError("upstream down")
    assert router.in_flight() == [0, 0]


def test_memory_per_replica_is_bounded() -> None:
    router = PrefixRouter(["r0", "r1"], RouterConfig(max_blocks_per_replica=10))
    for i in range(20):
        router.route("t", req(f"system {i} " * 100, "q"))
    assert [len(r.blocks) for r in router._replicas] == [10, 10]  # bounded, and spread out


def test_new_prefixes_spread_over_idle_replicas() -> None:
    router = PrefixRouter(["r0", "r1", "r2"])
    chosen = [router.route("t", req(f"system prompt {i} " * 50, "q"))[0] for i in range(3)]
    assert sorted(chosen) == [0, 1, 2]


def test_a_single_replica_is_chosen_without_hashing() -> None:
    router = PrefixRouter(["only"])
    assert router.route("t", req(SYSTEM, "q")) == (0, 0)
    assert len(router._replicas[0].blocks) == 0


def sharing_router(shared_kv: bool = True) -> tuple[PrefixRouter[str], ManualClock]:
    clock = ManualClock()
    router: PrefixRouter[str] = PrefixRouter(["r0", "r1", "r2"], monotonic_s=clock.monotonic_s)
    for i in range(3):
        router.report_load(i, ReplicaLoad(waiting=0, running=0, shared_kv=shared_kv))
    return router, clock


def test_a_prefix_in_the_shared_kv_tier_is_warm_on_every_sharing_replica() -> None:
    router, _ = sharing_router()
    first, _ = router.route("t", req(SYSTEM, "q0"))
    with contextlib.ExitStack() as held:
        for i in range(3):  # the RAM holder gets busier than the others by 3 > 2
            held.enter_context(router.lease("t", req(SYSTEM, f"busy {i}")))
        assert router.in_flight()[first] == 3
        index, warmth = router.route("t", req(SYSTEM, "q1"))
    assert index != first
    assert warmth >= 4  # warm there through the shared tier


def test_the_replica_holding_the_prefix_in_ram_stays_preferred_at_a_small_imbalance() -> None:
    router, _ = sharing_router()
    first, _ = router.route("t", req(SYSTEM, "q0"))
    with router.lease("t", req(SYSTEM, "busy")) as busy:
        assert busy == first
        assert router.route("t", req(SYSTEM, "q1"))[0] == first  # 1 more in flight: stays


def test_without_a_shared_tier_a_busy_warm_replica_keeps_its_prefixes() -> None:
    router, _ = sharing_router(shared_kv=False)
    first, _ = router.route("t", req(SYSTEM, "q0"))
    with contextlib.ExitStack() as held:
        for i in range(3):
            held.enter_context(router.lease("t", req(SYSTEM, f"busy {i}")))
        assert router.route("t", req(SYSTEM, "q1"))[0] == first  # 3 < imbalance_abs 8


def test_shared_warmth_needs_a_fresh_report_from_the_replica() -> None:
    router, clock = sharing_router()
    first, _ = router.route("t", req(SYSTEM, "q0"))
    clock.advance(router.config.load_stale_s + 1)  # every report is stale: unknown
    others = [i for i in range(3) if i != first]
    assert all(router._replicas[i].match(block_hashes(SYSTEM, 64)) == 0 for i in others)
    with contextlib.ExitStack() as held:
        for i in range(3):
            held.enter_context(router.lease("t", req(SYSTEM, f"busy {i}")))
        assert router.route("t", req(SYSTEM, "q1"))[0] == first
