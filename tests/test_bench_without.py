"""bench/without.py switches per-request features off to measure what they cost: each switch
must really take its feature out, and a target the package renamed must fail loudly rather
than leave the feature on and the measurement silently wrong."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from infercache import store_guard
from infercache.clock import ManualClock
from infercache.gateway import http_server
from infercache.gateway.traffic import RequestMetrics
from infercache.served_answers import ServedAnswers, ServedBy
from infercache.store_guard import GuardedBackend

WITHOUT = Path(__file__).resolve().parents[1] / "bench" / "without.py"


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The bench module, with every target it replaces restored after the test."""
    for owner, name in (
        (RequestMetrics, "record"),
        (ServedAnswers, "remember"),
        (GuardedBackend, "_call"),
        (http_server, "server_config"),
        (store_guard, "inline_reads"),
        (store_guard, "inline_writes"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    spec = importlib.util.spec_from_file_location("bench_without", WITHOUT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _requests_series(metrics: RequestMetrics) -> list[object]:
    return [s for family in metrics.collect() for s in family.samples if "requests" in s.name]


def test_metrics_off_records_no_request(without: ModuleType) -> None:
    on = RequestMetrics()
    on.record("chat", "t", "m", 200, "miss", None, 0.01)
    assert _requests_series(on)
    without.FEATURES["metrics"]()
    off = RequestMetrics()
    off.record("chat", "t", "m", 200, "miss", None, 0.01)
    assert _requests_series(off) == []


def test_feedback_off_remembers_nothing(without: ModuleType) -> None:
    without.FEATURES["feedback"]()
    served = ServedAnswers(max_answers=10, ttl_s=60.0, clock=ManualClock())
    served.remember("t", "chatcmpl-1", ServedBy.FETCHED, ("k",))
    assert len(served) == 0


def test_guard_off_calls_the_store_directly(without: ModuleType) -> None:
    original = GuardedBackend._call
    without.FEATURES["guard"]()
    assert GuardedBackend._call is not original
    assert GuardedBackend._call(object(), lambda x: x + 1, 41) == 42  # type: ignore[arg-type]


def test_head_bound_off_leaves_uvicorn_its_own_protocol(without: ModuleType) -> None:
    assert http_server.server_config(None)["http"] is http_server.BoundedHeadersProtocol
    without.FEATURES["head-bound"]()
    config = http_server.server_config(None, port=1)
    assert "http" not in config
    assert config["port"] == 1


def test_nonblocking_off_makes_plain_calls(without: ModuleType) -> None:
    without.FEATURES["nonblocking"]()
    for inline in (store_guard.inline_reads, store_guard.inline_writes):
        assert inline(object()) is contextlib.nullcontext  # type: ignore[arg-type]


def test_a_renamed_target_fails_loudly(without: ModuleType) -> None:
    with pytest.raises(AttributeError, match="out of date"):
        without._replace(RequestMetrics, "record_renamed", None)


def test_the_command_runs_the_installed_script_or_this_module(without: ModuleType) -> None:
    assert Path(without.command("")[0]).name == "infercache"
    switched = without.command("metrics,guard")
    assert Path(switched[1]) == WITHOUT
    assert switched[2] == "metrics,guard"
