"""The KV tiers in the engine (tiny random model): greedy answers with tiers on equal those
with reuse off, across restarts and through faults (acceptance 4: a block file truncated,
bit-flipped, deleted mid-read, the directory read-only or full, Redis stopped), each fault
counted and nothing failing. A read-only or full directory is made real with a bind mount or a
small tmpfs when the tests run as root (as here and in CI), and skipped otherwise."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infercache.engine.config import EngineConfig
from infercache.engine.engine import Engine
from infercache.engine.kv_disk import SUFFIX
from tests.conftest import start_redis
from tests.engine.conftest import TinyFactory

SYSTEM = "You are a helpful assistant. Answer the question briefly and politely. " * 3
QUESTIONS = ["hello world", "how are you today", "the capital of France", "radix trees share"]
BLOCK = 8


def body(model: str, question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"model": model, "messages": messages, "temperature": 0, "max_tokens": 6}


def answers(engine: Engine) -> list[str]:
    return [
        engine.chat(body(engine.model_id, q))["choices"][0]["message"]["content"] for q in QUESTIONS
    ]


def counters(engine: Engine) -> dict[str, float]:
    return dict(engine.stats()["prefix"].get("counters", {}))


@pytest.fixture(scope="module")
def reference(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The answers with KV reuse off."""
    data = tmp_path_factory.mktemp("reference")
    with Engine(EngineConfig(data_dir=data, model_path=tiny_dir, prefix_cache=False)) as engine:
        return answers(engine)


@pytest.fixture
def tiered(tiny_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Engines on the tiny model with a disk tier in tmp_path/kv (one open at a time)."""
    opened: list[Engine] = []

    def make(**config: Any) -> Engine:
        for engine in opened:
            engine.close()
        settings: dict[str, Any] = {
            "data_dir": tmp_path / "data",
            "model_path": tiny_dir,
            "kv_disk_bytes": 16 << 20,
            "kv_disk_dir": tmp_path / "kv",
            "kv_block_tokens": BLOCK,
            **config,
        }
        engine = Engine(EngineConfig(**settings))
        opened.append(engine)
        return engine

    yield make
    for engine in opened:
        engine.close()


def block_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "kv").glob(f"*/*{SUFFIX}"))


def test_answers_are_the_same_across_a_restart_served_from_disk(
    tiered: Callable[..., Engine], reference: list[str], tmp_path: Path
) -> None:
    assert answers(tiered()) == reference
    restarted = tiered()
    assert answers(restarted) == reference
    c = counters(restarted)
    assert c["prefix_cache_hits:disk"] >= len(SYSTEM) // 2  # the system prompt, at least
    assert c["external_prefix_cache_hits"] == c["prefix_cache_hits:disk"]
    tiers = restarted.stats()["kv_tiers"]
    assert tiers["disk"]["blocks"] == len(block_files(tmp_path))
    text = restarted.metrics.to_prometheus().decode()
    assert 'infercache_prefix_cache_tier_hits_total{strategy="prefix",tier="disk"}' in text
    assert 'infercache_kv_tier_bytes{strategy="prefix",tier="disk"}' in text


@contextlib.contextmanager
def mounted(*args: str) -> Iterator[None]:
    """`mount ARGS...` for the block; skips the test where mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("making a directory read-only or full for root needs a mount")
    target = args[-1]
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount refused: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", target], check=True)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    with mounted("--bind", str(path), str(path)):
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
        yield


def damage(tmp_path: Path, fault: str) -> None:
    files = block_files(tmp_path)
    assert len(files) >= 3
    target = files[len(files) // 2]
    data = bytearray(target.read_bytes())
    if fault == "truncated":
        target.write_bytes(data[:100])
    elif fault == "bit_flip":
        data[len(data) - 10] ^= 0x04
        target.write_bytes(data)


@pytest.mark.parametrize("fault", ["truncated", "bit_flip"])
def test_a_damaged_block_file_is_recomputed_with_the_same_answers(
    tiered: Callable[..., Engine], reference: list[str], tmp_path: Path, fault: str
) -> None:
    answers(tiered())
    damage(tmp_path, fault)
    restarted = tiered()
    assert answers(restarted) == reference
    assert counters(restarted)["kv_blocks_corrupt:disk"] >= 1


def test_blocks_deleted_after_start_are_counted_missing_with_the_same_answers(
    tiered: Callable[..., Engine], reference: list[str], tmp_path: Path
) -> None:
    answers(tiered())
    restarted = tiered()  # its index lists every block
    for f in block_files(tmp_path):
        f.unlink()
    assert answers(restarted) == reference
    assert counters(restarted)["kv_blocks_missing:disk"] >= 1


def test_a_read_only_directory_still_serves_its_blocks_and_counts_failed_writes(
    tiered: Callable[..., Engine], reference: list[str], tmp_path: Path
) -> None:
    answers(tiered())
    kv = tmp_path / "kv"
    with read_only(kv):
        restarted = tiered()
        new = restarted.chat(body(restarted.model_id, "a question never asked before"))
        assert answers(restarted) == reference
        c = counters(restarted)
        restarted.close()
    assert c["prefix_cache_hits:disk"] > 0
    assert c["kv_tier_errors:disk"] >= 1  # the new question's blocks could not be written
    assert new["choices"][0]["finish_reason"] == "length"


def test_a_full_directory_counts_failed_writes_and_answers_the_same(
    tiered: Callable[..., Engine], reference: list[str], tmp_path: Path
) -> None:
    kv = tmp_path / "kv"
    kv.mkdir()
    with mounted("-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(kv)):
        engine = tiered()  # a budget of 16 MiB on a 64 KiB file system
        assert answers(engine) == reference
        c = counters(engine)
        engine.close()
    assert c["kv_tier_errors:disk"] >= 1
    assert c.get("kv_blocks_written:disk", 0) >= 1  # what fitted was written


def test_a_stopped_redis_costs_recomputation_not_answers(
    tiered: Callable[..., Engine], reference: list[str], tmp_path: Path
) -> None:
    (tmp_path / "redis").mkdir()
    with start_redis(tmp_path / "redis") as server:
        url = server.url()
        first = tiered(kv_disk_bytes=0, kv_shared_url=url)
        assert answers(first) == reference
        second = tiered(kv_disk_bytes=0, kv_shared_url=url)
        assert answers(second) == reference
        assert counters(second)["prefix_cache_hits:shared"] > 0
    third = tiered(kv_disk_bytes=0, kv_shared_url=url)  # Redis is gone
    assert answers(third) == reference
    c = counters(third)
    assert c["kv_tier_errors:shared"] >= 1
    assert "prefix_cache_hits:shared" not in c
    assert third.stats()["kv_tiers"]["shared"]["state"] != "ok"


def test_a_model_swap_leaves_no_old_block_reachable_and_reclaims_them(
    tiered: Callable[..., Engine], make_tiny_llama: TinyFactory, tmp_path: Path
) -> None:
    engine = tiered()
    answers(engine)
    old = {f.parent for f in block_files(tmp_path)}
    assert old
    other = make_tiny_llama(seed=1)
    engine.swap_model(other, served_model_id=engine.model_id)  # same id, other weights
    assert not any(d.exists() for d in old)
    answers(engine)
    assert "prefix_cache_hits:disk" not in counters(engine)
    assert {f.parent for f in block_files(tmp_path)}.isdisjoint(old)
