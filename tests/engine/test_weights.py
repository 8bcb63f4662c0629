"""Resolving, converting (atomically), fingerprinting and loading checkpoints."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from infercache.engine.config import EngineConfig, default_data_dir
from infercache.engine.weights import (
    ResolvedModel,
    load_checkpoint,
    publish_directory,
    resolve_model,
    version_digest,
)
from infercache.errors import ConfigError

from .conftest import TinyFactory


def test_concurrent_publishers_leave_one_complete_folder(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    barrier = threading.Barrier(4)
    results: list[Path] = []

    def build(out: Path) -> None:
        barrier.wait(10)  # every builder is mid-build at once
        (out / "weights").write_text(threading.current_thread().name)
        (out / "done").write_text("yes")

    def publish() -> None:
        results.append(publish_directory(target, build))

    threads = [threading.Thread(target=publish, name=f"builder-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [target] * 4
    assert sorted(p.name for p in target.iterdir()) == ["done", "weights"]
    assert [p.name for p in target.parent.iterdir()] == ["m"]  # no temporary folder left


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "m"

    def build(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        publish_directory(target, build)
    assert list(tmp_path.iterdir()) == []


def test_digest_changes_with_weights_and_config_only(
    tmp_path: Path, make_tiny_llama: TinyFactory
) -> None:
    a = make_tiny_llama(seed=1)
    b = make_tiny_llama(seed=2)
    copy = shutil.copytree(a, tmp_path / "copy")
    assert version_digest(a) == version_digest(copy)
    assert version_digest(a) != version_digest(b)
    (copy / "README.md").write_text("not part of the model")
    assert version_digest(copy) == version_digest(a)
    config = json.loads((copy / "config.json").read_text())
    config["rms_norm_eps"] = 1e-6
    (copy / "config.json").write_text(json.dumps(config))
    assert version_digest(copy) != version_digest(a)
    assert version_digest(a).startswith("fp_")


def test_folder_version_is_stored_and_refreshed_when_files_change(
    tmp_path: Path, make_tiny_llama: TinyFactory
) -> None:
    folder = shutil.copytree(make_tiny_llama(seed=1), tmp_path / "model")
    data = tmp_path / "data"
    first = resolve_model(folder, data)
    assert first == ResolvedModel(folder.resolve(), "model", version_digest(folder))
    assert len(list((data / "digests").iterdir())) == 1
    shutil.copy(make_tiny_llama(seed=2) / "model.safetensors", folder / "model.safetensors")
    assert resolve_model(folder, data).checkpoint_version == version_digest(make_tiny_llama(seed=2))


def test_unusable_model_paths_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json"):
        resolve_model(tmp_path, tmp_path / "data")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="safetensors"):
        resolve_model(tmp_path, tmp_path / "data")


def test_sequence_length_dependent_rope_is_refused(make_tiny_llama: TinyFactory) -> None:
    folder = make_tiny_llama(
        seed=5, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    )
    with pytest.raises(ConfigError, match="dynamic"):
        load_checkpoint(folder)


def test_config_reads_the_data_dir_from_the_environment(tmp_path: Path) -> None:
    assert default_data_dir({"INFERCACHE_DATA_DIR": str(tmp_path)}) == tmp_path
    assert default_data_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/infercache")
    assert EngineConfig.from_env({"INFERCACHE_DATA_DIR": "/d"}).data_dir == Path("/d")


@pytest.mark.parametrize(
    "bad", [{"max_kv_bytes": -1}, {"threads": 0}, {"max_context_tokens": 1}, {"dtype": "int8"}]
)
def test_invalid_engine_config_is_refused(tmp_path: Path, bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        EngineConfig(data_dir=tmp_path, **bad)  # type: ignore[arg-type]


@pytest.mark.slow
def test_packaged_model_is_converted_once_with_its_version_stored(
    smol_resolved: ResolvedModel, smol_data_dir: Path
) -> None:
    again = resolve_model(None, smol_data_dir)
    assert again == smol_resolved
    assert smol_resolved.model_id == "SmolLM2-135M-Instruct"
    assert smol_resolved.directory.parent == smol_data_dir / "models"
    stored = json.loads((smol_resolved.directory / "infercache-version.json").read_text())
    digest = version_digest(smol_resolved.directory)
    assert stored["version"] == smol_resolved.checkpoint_version == digest
