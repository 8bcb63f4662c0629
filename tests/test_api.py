"""The top-level API: `from infercache import Cache, Settings, wrap`, the types a user handles and
the errors; importing the package stays cheap and has no side effect."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import infercache
import infercache.cache
import infercache.completion
import infercache.errors
from infercache import Cache, Completion, InfercacheError, Layer, Settings, wrap
from infercache.clock import ManualClock
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat

HEAVY = ("torch", "transformers", "numpy", "openai", "httpx", "httpx2", "redis", "aiohttp")


def loaded_after(code: str, tmp_path: Path) -> list[str]:
    """Which heavy modules a fresh interpreter has loaded after running `code`."""
    probe = f"import sys\n{code}\nprint(__import__('json').dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,  # nothing in the working directory may answer an import
    )
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    return [m for m in HEAVY if m in modules]


def test_import_infercache_loads_no_heavy_library(tmp_path: Path) -> None:
    assert loaded_after("import infercache", tmp_path) == []


def test_the_cache_and_settings_load_no_model_library(tmp_path: Path) -> None:
    loaded = loaded_after("from infercache import Cache, Settings", tmp_path)
    assert "torch" not in loaded
    assert "transformers" not in loaded


def test_import_infercache_has_no_side_effect(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", "import infercache, infercache.errors"],
        check=True,
        timeout=60,
        cwd=tmp_path,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert list(tmp_path.iterdir()) == []  # no cache directory, no database, no log file


def test_the_names_a_user_handles_are_the_modules_own() -> None:
    assert Cache is infercache.cache.Cache
    assert Completion is infercache.completion.Completion
    assert Layer is infercache.completion.Layer
    assert Settings.__module__ == "infercache.settings"
    assert wrap.__module__ == "infercache.openai.client"
    assert InfercacheError is infercache.errors.InfercacheError


def test_every_error_class_is_importable_from_the_package() -> None:
    errors = [
        name
        for name, obj in inspect.getmembers(infercache.errors, inspect.isclass)
        if issubclass(obj, InfercacheError) and obj.__module__ == "infercache.errors"
    ]
    assert len(errors) >= 17
    for name in errors:
        assert getattr(infercache, name) is getattr(infercache.errors, name)
    assert {"InfercacheError", "InvalidRequestError", "NotCachedError"} <= set(infercache.__all__)


def test_all_names_resolve_and_unknown_ones_raise_attribute_error() -> None:
    for name in infercache.__all__:
        assert getattr(infercache, name) is not None
    assert set(infercache.__all__) <= set(dir(infercache))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = infercache.Nope  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'NopeError'"):
        _ = infercache.NopeError  # type: ignore[attr-defined]


def test_the_version_is_the_installed_distributions() -> None:
    assert infercache.__version__ == importlib.metadata.version("infercache")


# -- Cache.invalidate takes one tag or many --


def test_invalidate_takes_one_tag_string_as_one_tag(
    tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    cache = Cache(Settings(data_dir=tmp_path, store_url="memory://"), clock=clock)
    pricing = chat("price?", infercache={"tags": ["kb:pricing"]})
    letter = chat("k?", infercache={"tags": ["k"]})  # "k" is a character of "kb:pricing"
    cache.complete(pricing, upstream)
    cache.complete(letter, upstream)

    assert cache.invalidate("kb:pricing") == 1
    assert cache.complete(pricing, upstream).layer is Layer.MISS
    assert cache.complete(letter, upstream).layer is Layer.EXACT
    assert cache.invalidate(["kb:pricing", "k"]) == 2
    assert cache.complete(letter, upstream).layer is Layer.MISS
