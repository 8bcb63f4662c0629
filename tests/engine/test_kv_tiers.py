"""The KV tiers below RAM (engine/kv_tiers.py over kv_disk.py and kv_blocks.py), driven through
the prefix cache with fake KV (kv_fakes.py: each position's KV derived from its prefix), so every
load is checked against the KV of exactly that prompt's prefix. No model: milliseconds each."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from infercache.engine.kv_disk import SUFFIX
from tests.engine.kv_fakes import BLOCK, Replica

PROMPT = tuple(range(100, 150))  # 50 tokens: 6 whole blocks of 8, the 7th never (last token)


def block_files(tmp: Path) -> list[Path]:
    return sorted((tmp / "kv").glob(f"*/*{SUFFIX}"))


def file_of(replica: Replica, prompt: tuple[int, ...], index: int, namespace: str = "ns") -> Path:
    assert replica.tiers is not None
    assert replica.tiers.disk is not None
    blocks = replica.tiers.names.blocks(namespace, prompt, index + 1)
    return replica.tiers.disk.directory / (blocks.name(index) + SUFFIX)


@pytest.fixture
def warm(tmp_path: Path) -> Replica:
    """A replica that served PROMPT once, then stopped: its blocks are on disk."""
    first = Replica(tmp_path)
    assert first.ask(PROMPT).reused_tokens == 0
    first.close()
    return first


def test_a_restarted_replica_loads_the_prefix_from_disk_then_serves_it_from_ram(
    tmp_path: Path, warm: Replica
) -> None:
    assert len(block_files(tmp_path)) == len(PROMPT) // BLOCK
    again = warm.restart()
    lease = again.ask((*PROMPT[:-1], 999, 998))  # same first 49 tokens
    assert lease.tiers is not None
    assert (lease.ram_tokens, lease.tiers.disk_tokens, lease.reused_tokens) == (0, 48, 48)
    assert again.counters()["kv_blocks_loaded:disk"] == 6
    # Loaded blocks were inserted into the tree at admission: the next ask hits RAM.
    next_lease = again.ask(PROMPT)
    assert next_lease.ram_tokens == 49
    assert next_lease.tiers is not None
    assert next_lease.tiers.disk_tokens == 0


def test_a_load_continues_from_where_ram_ends_inside_a_block(tmp_path: Path) -> None:
    replica = Replica(tmp_path, max_kv_bytes=20 * 128)  # RAM holds 20 tokens
    replica.ask(PROMPT)  # RAM keeps the head that fits: 20 tokens, not a block boundary
    lease = replica.ask(PROMPT)
    assert lease.tiers is not None
    assert lease.ram_tokens == 20
    assert lease.tiers.disk_tokens == 48 - 20  # block 2 from token 20 on, then blocks 3..5
    assert lease.reused_tokens == 48


def test_block_files_are_the_engine_users_alone(tmp_path: Path, warm: Replica) -> None:
    files = block_files(tmp_path)
    assert files
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    for d in (tmp_path / "kv", files[0].parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


@pytest.mark.parametrize("fault", ["truncated", "bit_flip_kv", "bit_flip_tokens", "deleted"])
def test_a_damaged_block_is_a_counted_recompute_from_that_block_on(
    tmp_path: Path, warm: Replica, fault: str
) -> None:
    target = file_of(warm, PROMPT, 3)
    data = bytearray(target.read_bytes())
    if fault == "truncated":
        target.write_bytes(data[: len(data) // 2])
    elif fault == "deleted":
        target.unlink()
    else:
        at = -5 if fault == "bit_flip_kv" else 64 + 4 * 10  # a K/V byte, or token 10
        data[at] ^= 0x10
        target.write_bytes(data)
    again = warm.restart()
    lease = again.ask(PROMPT)  # asserts every reused position holds the right KV
    assert lease.reused_tokens == 3 * BLOCK
    counters = again.counters()
    if fault == "deleted":  # before the start: absent from the index, a plain miss
        assert "kv_blocks_corrupt:disk" not in counters
    else:
        assert counters["kv_blocks_corrupt:disk"] == 1
    assert counters["kv_blocks_loaded:disk"] == 3
    # The damaged block is gone and was written again from the recomputation.
    assert target.is_file()
    assert again.restart().ask(PROMPT).reused_tokens == 6 * BLOCK


def test_a_block_deleted_after_the_index_listed_it_is_missing_not_an_error(
    tmp_path: Path, warm: Replica
) -> None:
    again = warm.restart()  # the index lists all six
    file_of(again, PROMPT, 0).unlink()  # gone between the listing and the read
    lease = again.ask(PROMPT)
    assert lease.reused_tokens == 0
    assert again.counters()["kv_blocks_missing:disk"] == 1


def test_tenants_never_load_each_others_blocks_even_when_planted(
    tmp_path: Path, warm: Replica
) -> None:
    again = warm.restart()
    assert again.ask(PROMPT, namespace="other").reused_tokens == 0
    # Plant tenant ns's blocks under the names tenant "intruder" would look up.
    for index in range(6):
        planted = file_of(again, PROMPT, index, namespace="intruder")
        planted.write_bytes(file_of(again, PROMPT, index).read_bytes())
    third = again.restart()
    assert third.ask(PROMPT, namespace="intruder").reused_tokens == 0
    assert third.counters()["kv_blocks_corrupt:disk"] == 1  # rejected (header), then recomputed


def test_a_model_swap_makes_old_blocks_unreachable_and_reclaims_them(
    tmp_path: Path, warm: Replica
) -> None:
    old = {f.parent for f in block_files(tmp_path)}
    stranger = tmp_path / "kv" / "notes"  # a folder the user keeps there: never touched
    stranger.mkdir()
    swapped = warm.restart(fingerprint="fp_other_weights")
    assert swapped.ask(PROMPT).reused_tokens == 0
    assert not any(d.exists() for d in old)
    assert {f.parent for f in block_files(tmp_path)}.isdisjoint(old)
    assert stranger.is_dir()


def test_the_disk_tier_stays_within_its_budget_under_1000_distinct_prefixes(
    tmp_path: Path,
) -> None:
    budget = 40 * 1120  # forty blocks 0 (64 header + 8 × 4 token + 1,024 KV bytes)
    replica = Replica(tmp_path, disk_bytes=budget, max_kv_bytes=32 * 128)
    assert replica.tiers is not None
    disk = replica.tiers.disk
    assert disk is not None
    worst = 0
    for i in range(1000):
        replica.ask((i % 7, i, *range(1000 + i, 1007 + i)))  # 9 tokens: 1 whole block saved
        worst = max(worst, disk.used_bytes)
    on_disk = sum(f.stat().st_size for f in block_files(tmp_path))
    assert worst <= budget
    assert on_disk == disk.used_bytes <= budget
    assert replica.counters()["kv_blocks_evicted:disk"] == 1000 - 40
    # The most recent prefixes are still there, heads and all.
    latest = (999 % 7, 999, *range(1999, 2006))
    assert replica.restart().ask(latest).reused_tokens == BLOCK


def test_a_second_engine_on_the_same_directory_runs_without_a_disk_tier(tmp_path: Path) -> None:
    holder = Replica(tmp_path)  # flock is per open file: a second open in-process is refused
    second = Replica(tmp_path)  # as another process's would be
    assert second.tiers is None
    assert second.counters() == {"kv_tier_errors:disk": 1}
    assert second.ask(PROMPT).reused_tokens == 0
    holder.close()
    assert Replica(tmp_path).tiers is not None  # released on close


def test_a_tier_failure_no_tier_foresaw_is_counted_and_the_prompt_recomputed(
    tmp_path: Path, warm: Replica, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    again = warm.restart()
    assert again.tiers is not None

    def broken(*args: object) -> None:
        raise RuntimeError("a bug in a tier")

    monkeypatch.setattr(again.tiers, "load", broken)
    monkeypatch.setattr(again.tiers, "save", broken)
    lease = again.ask(PROMPT)  # checks every reused position: nothing half-loaded is kept
    assert lease.reused_tokens == 0
    assert again.counters()["kv_tier_errors:unforeseen"] == 2  # the load, then the save
    assert "KV tiers failed to load" in caplog.text
    assert "KV tiers failed to save" in caplog.text
    assert again.ask(PROMPT).ram_tokens == len(PROMPT) - 1  # RAM kept what the save could not
