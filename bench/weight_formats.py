"""Which weight format for the built-in engine: speed and quality of every candidate PyTorch
kernel on this machine, against fp32, on the packaged SmolLM2-135M-Instruct.

    .venv/bin/python bench/weight_formats.py [--formats fp32,fp16,bf16,int8,int4,dyn-int8]
        [--sections speed,quality,reuse] [--rounds 5] [--threads N] [--prompts 200]
        [--out bench/out/weight_formats]

The model (`LlamaModel`) is the engine's; only its weight format changes (the `WeightFormat`
seam). `fp32` and `fp16` are the engine's own (engine/weight_formats.py); the others are
candidates defined here, each with PyTorch's own CPU kernel:
- `bf16`: bfloat16 weights prepacked for oneDNN (AMX / AVX512-BF16 on this CPU); activations
  rounded to bfloat16 at each projection's input, results widened back.
- `int8`: int8 weights, one scale per output row (`torch._weight_int8pack_mm`); bfloat16
  activations (its float32 path is unvectorised: slower than fp32).
- `int4`: 4-bit weights in groups of 32 along the input, with a scale and an offset per group
  (`torch.ops.aten._weight_int4pack_mm_for_cpu`, bfloat16 activations, scales and offsets).
- `dyn-int8`: int8 weights per row and activations quantised per tensor at each call (FBGEMM's
  `quantized::linear_dynamic`, as `torch.ao.quantization.quantize_dynamic` does).
The LM head of bf16, int8 and int4 stays fp16 (the engine's `Fp16Linear`): in bfloat16 it alone
cost 16 of the 30 greedy-agreement points those formats lose (bench/README.md).

Speed (`--sections speed`), every format in turn each round, the best of `--rounds` kept:
- decode: 32 greedy one-token forwards of one sequence after a 40-token prompt, tok/s;
- 16 streams: 16 one-token steps of 16 sequences batched (`forward_batch`), tok/s together;
- prefill: a 512-token prompt in two 256-token chunks (the engine's `max_step_tokens`), ms.
Quality (`--sections quality`), each format against fp32:
- perplexity of tests/engine/data/hwu64_intents.txt (CC BY 4.0), one context;
- on `--prompts` of tests/engine/data/banking77_prompts.txt (CC BY 4.0) as chat prompts, the
  share whose first 16 greedy tokens equal fp32's (25 prompts batched a step).
Gate: perplexity within 3% of fp32's and ≥ 80% of prompts identical.
KV reuse (`--sections reuse`), each format alone: on the first 50 of those prompts after a
shared system prompt, the greedy tokens with the system prompt prefilled first and the question
after it (what the engine's prefix reuse does) against the whole prompt at once.
Everything printed is also written to `<out>/results-<threads>t.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tee import Tee

from infercache.engine.linear import Fp16Linear, Projection
from infercache.engine.model import LlamaModel, Segment
from infercache.engine.quality import Answers, answers, compare
from infercache.engine.weight_formats import (
    DenseTable,
    EmbeddingTable,
    WeightFormat,
    weight_format,
)
from infercache.engine.weights import Checkpoint, load_checkpoint, resolve_model
from infercache.settings import default_data_dir

DATA = Path(__file__).resolve().parents[1] / "tests" / "engine" / "data"
BF16 = torch.bfloat16
NEW_TOKENS = 16


class _Kernel:
    """A candidate projection: `call(x_bf16)` for a bfloat16-activation kernel."""

    def __init__(self, call: Callable[[torch.Tensor], torch.Tensor], weight_bytes: int) -> None:
        self._call = call
        self.weight_bytes = weight_bytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._call(x.to(BF16)).to(x.dtype)


def _bf16(weight: torch.Tensor) -> _Kernel:
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(BF16), 8)
    return _Kernel(
        lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        weight.numel() * 2,
    )


def _int8(weight: torch.Tensor) -> _Kernel:
    scale = (weight.abs().amax(1) / 127).clamp(min=1e-12)
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    s = scale.to(BF16)
    return _Kernel(lambda x: torch._weight_int8pack_mm(x, q, s), weight.numel() + s.nbytes)


def _int4(weight: torch.Tensor, group: int = 32) -> _Kernel:
    n, k = weight.shape
    grouped = weight.view(n, k // group, group)
    low, high = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((grouped - low) / scale).clamp(0, 15).to(torch.int32).view(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    # The kernel computes (q - 8) * scale + offset.
    offsets = torch.cat([scale, low + 8 * scale], -1).transpose(0, 1).contiguous().to(BF16)
    return _Kernel(
        lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, offsets),
        packed.nbytes + offsets.nbytes,
    )


class _DynamicInt8:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        torch.backends.quantized.engine = "fbgemm"
        scale = (weight.abs().amax(1) / 127).clamp(min=1e-12).double()
        zeros = torch.zeros(weight.shape[0], dtype=torch.long)
        q = torch.quantize_per_channel(weight, scale, zeros, 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(q, bias)
        self.weight_bytes = weight.numel()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.quantized.linear_dynamic(x.float(), self._packed, True)
        return out.to(x.dtype)


class Candidate:
    """A `WeightFormat` of this bench: `layers` builds the transformer layers' projections;
    the LM head is fp16 unless `head` says otherwise; the embedding table is fp16."""

    def __init__(
        self,
        name: str,
        layers: Callable[[torch.Tensor, torch.Tensor | None], Projection],
        head: Callable[[torch.Tensor], Projection] | None = None,
    ) -> None:
        self.name = name
        self._layers = layers
        self._head = head or (lambda w: Fp16Linear(w, None))

    def projection(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool
    ) -> Projection:
        if bias is not None:
            raise ValueError(f"{self.name}: no bias support in this bench")
        return self._layers(weight, bias)

    def head(self, weight: torch.Tensor, *, packed: bool) -> Projection:
        return self._head(weight)

    def embedding(self, weight: torch.Tensor) -> EmbeddingTable:
        return DenseTable(weight.to(torch.float16))


CANDIDATES: dict[str, Callable[[], WeightFormat]] = {
    "fp32": lambda: weight_format("fp32"),
    "fp16": lambda: weight_format("fp16"),
    "bf16": lambda: Candidate("bf16", lambda w, b: _bf16(w)),
    "int8": lambda: Candidate("int8", lambda w, b: _int8(w)),
    "int4": lambda: Candidate("int4", lambda w, b: _int4(w)),
    "dyn-int8": lambda: Candidate("dyn-int8", _DynamicInt8, lambda w: _DynamicInt8(w, None)),
}


def load(checkpoint: Checkpoint, name: str) -> LlamaModel:
    return LlamaModel(
        checkpoint.spec, checkpoint.tensors, max_positions=4096, weights=CANDIDATES[name]()
    )


def decode_rate(model: LlamaModel, seed: int, tokens: int = 32) -> float:
    ws = model.new_workspace(256)
    prompt = torch.randint(1000, 40_000, (40,), generator=torch.Generator().manual_seed(seed))
    token = int(model.forward(prompt, ws, 0).argmax())
    started = time.perf_counter()
    for step in range(tokens):
        token = int(model.forward(torch.tensor([token]), ws, 40 + step).argmax())
    return tokens / (time.perf_counter() - started)


def batch_rate(model: LlamaModel, seed: int, streams: int = 16, steps: int = 16) -> float:
    g = torch.Generator().manual_seed(seed)
    spaces = [model.new_workspace(256) for _ in range(streams)]
    prompts = [Segment(torch.randint(1000, 40_000, (40,), generator=g), ws, 0) for ws in spaces]
    tokens = model.forward_batch(prompts).argmax(-1).tolist()
    started = time.perf_counter()
    for step in range(steps):
        segments = [
            Segment(torch.tensor([t]), ws, 40 + step) for t, ws in zip(tokens, spaces, strict=True)
        ]
        tokens = model.forward_batch(segments).argmax(-1).tolist()
    return streams * steps / (time.perf_counter() - started)


def prefill_ms(model: LlamaModel, seed: int, length: int = 512, chunk: int = 256) -> float:
    ws = model.new_workspace(length)
    ids = torch.randint(1000, 40_000, (length,), generator=torch.Generator().manual_seed(seed))
    started = time.perf_counter()
    for start in range(0, length, chunk):
        model.forward(ids[start : start + chunk], ws, start)
    return (time.perf_counter() - started) * 1e3


def speed(checkpoint: Checkpoint, names: list[str], rounds: int) -> None:
    models = {name: load(checkpoint, name) for name in names}
    results: dict[str, dict[str, list[float]]] = {n: {"d": [], "b": [], "p": []} for n in names}
    with torch.inference_mode():
        for model in models.values():
            decode_rate(model, -1, 4)  # warm-up: first touch of weights and kernels
        for r in range(rounds):  # every format in turn each round: drift hits them alike
            for name, model in models.items():
                results[name]["d"].append(decode_rate(model, r))
                results[name]["b"].append(batch_rate(model, r))
                results[name]["p"].append(prefill_ms(model, r))
                got = {k: round(v[-1], 1) for k, v in results[name].items()}
                print(f"round {r + 1} {name}: {got}", file=sys.stderr, flush=True)
            print(f"round {r + 1}: load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    base = results.get("fp32")
    print("\n| format | decode tok/s | × fp32 | 16 streams tok/s | × fp32 | prefill 512 ms "
          "| × fp32 |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        d, b, p = max(results[name]["d"]), max(results[name]["b"]), min(results[name]["p"])
        ratios = ("", "", "")
        if base is not None:
            bd, bb, bp = max(base["d"]), max(base["b"]), min(base["p"])
            ratios = (f"{d / bd:.2f}×", f"{b / bb:.2f}×", f"{bp / p:.2f}×")
        print(f"| {name} | {d:.1f} | {ratios[0]} | {b:.1f} | {ratios[1]} | {p:.0f} "
              f"| {ratios[2]} |")  # fmt: skip


def chat_prompts(tokenizer: Any, lines: list[str]) -> list[list[int]]:
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": line}], add_generation_prompt=True, tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for line in lines
    ]  # fmt: skip


def quality(checkpoint: Checkpoint, names: list[str], n_prompts: int) -> None:
    tokenizer = checkpoint.tokenizer
    text = torch.tensor(tokenizer((DATA / "hwu64_intents.txt").read_text())["input_ids"])
    lines = (DATA / "banking77_prompts.txt").read_text().splitlines()[:n_prompts]
    prompts = chat_prompts(tokenizer, lines)
    print(f"\nperplexity over {len(text)} tokens; greedy {NEW_TOKENS} tokens on {len(prompts)} "
          "chat prompts\n")  # fmt: skip
    print("| format | perplexity | vs fp32 | prompts with fp32's 16 tokens | mean first differing "
          "token | gate |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---|")
    reference: Answers | None = None
    for name in ["fp32", *(n for n in names if n != "fp32")]:
        got = answers(load(checkpoint, name), text, prompts, NEW_TOKENS)
        reference = reference or got
        c = compare(got, reference)
        print(f"| {name} | {got.perplexity:.3f} | {c.perplexity_change:+.2%} | {c.identical}/"
              f"{c.prompts} ({c.identical_share:.0%}) | {c.mean_first_difference:.1f} "
              f"| {'pass' if c.passes else 'FAIL'} |", flush=True)  # fmt: skip


REUSE_SYSTEM = (
    "You are a helpful banking assistant. Answer briefly and politely, and never invent "
    "account details. "
) * 2


def greedy_split(model: LlamaModel, ids: list[int], split: int) -> tuple[list[int], list[Any]]:
    """The first `NEW_TOKENS` greedy tokens of `ids` and their logits, the prompt prefilled at
    once (`split` 0) or as its first `split` tokens then the rest (what KV reuse does)."""
    ws = model.new_workspace(len(ids) + NEW_TOKENS)
    if split:
        model.forward(torch.tensor(ids[:split]), ws, 0)
    logits = model.forward(torch.tensor(ids[split:]), ws, split)
    tokens, seen = [int(logits.argmax())], [logits]
    for step in range(NEW_TOKENS - 1):
        logits = model.forward(torch.tensor([tokens[-1]]), ws, len(ids) + step)
        tokens.append(int(logits.argmax()))
        seen.append(logits)
    return tokens, seen


def reuse(checkpoint: Checkpoint, names: list[str], n_prompts: int) -> None:
    """KV reuse within a format: a shared system prompt prefilled alone, then each question
    after it, against the whole prompt at once; identical greedy tokens and the largest logit
    difference up to the first differing token."""
    tokenizer = checkpoint.tokenizer
    system = {"role": "system", "content": REUSE_SYSTEM}
    framed = tokenizer.apply_chat_template([system], tokenize=True, return_dict=True)
    split = len(framed["input_ids"])
    lines = (DATA / "banking77_prompts.txt").read_text().splitlines()[:n_prompts]
    prompts = [
        list(tokenizer.apply_chat_template(
            [system, {"role": "user", "content": line}], add_generation_prompt=True,
            tokenize=True, return_dict=True,
        )["input_ids"])
        for line in lines
    ]  # fmt: skip
    print(f"\nKV reuse: a {split}-token system prompt reused vs recomputed, {NEW_TOKENS} greedy "
          f"tokens on {len(prompts)} prompts\n")  # fmt: skip
    print("| format | prompts with identical tokens | max logit difference |")
    print("|---|---:|---:|")
    for name in names:
        model, same, worst = load(checkpoint, name), 0, 0.0
        with torch.inference_mode():
            for ids in prompts:
                (a, la), (b, lb) = greedy_split(model, ids, 0), greedy_split(model, ids, split)
                same += a == b
                upto = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), -1)
                pairs = list(zip(la, lb, strict=True))[: upto + 1 if upto >= 0 else None]
                worst = max(worst, *((x - y).abs().max().item() for x, y in pairs))
        print(f"| {name} | {same}/{len(prompts)} | {worst:.1e} |", flush=True)


def run(args: argparse.Namespace) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    names = args.formats.split(",")
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SystemExit(f"unknown formats {unknown}; known: {list(CANDIDATES)}")
    print(
        f"# bench/weight_formats.py: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads; load "
        f"average {os.getloadavg()[0]:.1f}"
    )
    checkpoint = load_checkpoint(resolve_model(None, default_data_dir(os.environ)).directory)
    sections = args.sections.split(",")
    if "speed" in sections:
        speed(checkpoint, names, args.rounds)
    if "quality" in sections:
        quality(checkpoint, names, args.prompts)
    if "reuse" in sections:
        reuse(checkpoint, names, min(args.prompts, 50))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default=",".join(CANDIDATES))
    parser.add_argument("--sections", default="speed,quality")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "out" / "weight_formats"
    )
    args = parser.parse_args()
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"results-{args.threads}t.md").write_text(tee.getvalue())


if __name__ == "__main__":
    main()
