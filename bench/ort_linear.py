"""onnxruntime's 4-bit `MatMulNBits` for the engine's projections (issue 28, follow-up): does it
hold the packaged checkpoint's weights exactly, is it faster than PyTorch's fp32 and FBGEMM fp16
kernels, and is a row's result independent of the other rows in the call?

    .venv/bin/pip install onnxruntime onnx        # not in requirements: measured, not adopted
    .venv/bin/python bench/ort_linear.py [--sections exact,kernels,rows,speed,stream,model]
        [--rounds 30] [--threads 1,2] [--out bench/out/ort_linear]

The packaged SmolLM2-135M-Instruct was distributed as GGUF: every projection Q4_1 (groups of
32 along the input, `w = q·d + m`, `q` in 0..15, fp16 `d` and `m`), the embedding table (the
tied LM head) Q8_0 (`w = q·d`, `q` in −127..127). So its float32 weights are a dequantised
4-bit model, recovered here per group by min/max: `m` = the group's minimum, `d` = (max −
min) / 15, `q` = round((w − m) / d); `q·d + m` in float32 gives every weight back bit for bit.

`MatMulNBits` (com.microsoft contrib op, `accuracy_level` 1: float32 activations and sums)
takes `q` packed two a byte, a float32 scale per group and a zero point per group. Its fast
kernels take only integer zero points (`(q − zp)·s`), which cannot express an arbitrary `m`;
float zero points (measured: dequantised as `q·s − fl(zp·s)`) can for ~90% of groups, and run
a slow path. The format measured here: `q` with scale `d` and zero point 0 in `MatMulNBits`,
plus `groupsum(A) · m` (a float32 `[in / 32, out]` matrix, Reshape → ReduceSum → MatMul → Add
in the same graph): `Y = A · (q·d + m)ᵀ`. The LM head, Q8_0, as 8 bits (`q + 128`, zero
point 128) is exact too, but has no float32 fast kernel: the per-step estimates keep it fp16.

Sections (`--sections`, every figure printed and written to `<out>/results.md`):
- `exact`: layer 0's seven projections and the LM head dequantised by the session itself (an
  identity matrix multiplied through it) against the checkpoint's float32 weights.
- `kernels`: which inputs reach a fast kernel (float or integer zero points, `accuracy_level`).
- `rows`: a row's result alone and among 2, 7, 16, 64, 256 and 300 rows (the first rows of one
  random batch; and 20 rows of it each alone, doubled to a 2-row call), bit-identical or not;
  the largest difference from fp32's `F.linear`, and FBGEMM fp16's for scale.
- `speed`: ms a call of up (576 → 1,536), down (1,536 → 576) and the LM head (576 → 49,152)
  at 1, 2, 16 and 512 rows: oneDNN fp32 (the engine's prepacked `Fp32Linear`), FBGEMM fp16
  (`Fp16Linear`, the served format), `MatMulNBits` through `InferenceSession.run` (numpy in,
  a new output each call) and through `run_with_iobinding` (input and output bound once);
  every kernel in turn each round, best of `--rounds`, at each of `--threads` (torch's threads
  and the session's `intra_op_num_threads`). The same weight each call: it stays in cache.
- `stream`: a whole step's projections, every layer's own fused QKV, O, gate/up and down (so
  the weights stream from memory as in decode) and the LM head, at 1, 16 and 256 rows; 1
  thread only: with 2, each of the 120 sessions keeps its own pool thread spinning between
  calls (ORT's default), which took the shared machine's load to 60 in the run that found it.
- `model`: the same sum from layer 0's weights timed alone ×30 (cache-hot; an upper bound).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from tee import Tee

from infercache.engine.linear import Fp16Linear, Fp32Linear
from infercache.engine.weights import Checkpoint, load_checkpoint, resolve_model
from infercache.settings import default_data_dir

GROUP = 32
F32 = np.float32
LAYER = "model.layers.0."
PROJECTIONS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]
ROWS = (1, 2, 16, 512)
SUBSETS = (1, 2, 7, 16, 64, 256)
SPREAD = 20  # rows of the batch each checked alone, doubled to a 2-row call
BATCH = 300
ZP_STEPS = 8  # float32 neighbours of −m/d tried, each way, for an exact float zero point


@dataclass(frozen=True)
class Quantised:
    """`MatMulNBits` inputs for a float32 weight `[out, in]`."""

    bits: int
    packed: np.ndarray  # uint8 [out, in / GROUP, GROUP * bits / 8]
    scales: np.ndarray  # float32 [out * in / GROUP]
    zero_points: np.ndarray  # uint8 packed like the values, or float32 one a group
    unfit_groups: int  # groups the format cannot give back bit for bit
    offsets: np.ndarray | None = None  # float32 [in / GROUP, out]: each group's minimum


def _q4_groups(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Groups of 32 by min/max (GGUF Q4_1's own rule): the groups, `q`, `d` and `m`."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // GROUP, GROUP)
    low, high = groups.min(-1), groups.max(-1)
    d = ((high - low) / F32(15)).astype(F32)
    safe = np.where(d == 0, F32(1), d)[..., None]
    q = np.clip(np.round((groups - low[..., None]) / safe), 0, 15).astype(np.uint8)
    return groups, q, d, low


def _pack4(q: np.ndarray) -> np.ndarray:
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def q4_1(weight: np.ndarray) -> Quantised:
    """`MatMulNBits` holds `q` with scale `d` and integer zero point 0 (its fast kernels take
    only integer zero points): `q·d`, exact. The group minima `m` are a float32
    `[in / 32, out]` matrix multiplied by the input's group sums beside it:
    `Y = MatMulNBits(A) + groupsum(A) · m`, every weight `q·d + m` as in the checkpoint."""
    out, inp = weight.shape
    groups, q, d, low = _q4_groups(weight)
    back = (q.astype(F32) * d[..., None]).astype(F32) + low[..., None]
    unfit = int((~(back == groups).all(-1)).sum())
    zero = np.zeros(out * ((inp // GROUP + 1) // 2), dtype=np.uint8)
    return Quantised(4, _pack4(q), d.reshape(-1), zero, unfit, np.ascontiguousarray(low.T))


def q4_1_float_zp(weight: np.ndarray) -> Quantised:
    """The first try: `m` as a float zero point per group. The kernel dequantises
    `q·s − fl(zp·s)`; `zp` is fitted so that `fl(zp·d) = −m` where a float32 allows it."""
    groups, q, d, low = _q4_groups(weight)
    safe = np.where(d == 0, F32(1), d)[..., None]
    qd = (q.astype(F32) * safe).astype(F32)
    best = (-low / safe[..., 0]).astype(F32)
    fit = np.zeros(best.shape, dtype=bool)
    for direction in (np.inf, -np.inf):
        zp = (-low / safe[..., 0]).astype(F32)
        for _ in range(ZP_STEPS):
            hit = ((qd - (zp[..., None] * safe).astype(F32)).astype(F32) == groups).all(-1)
            best[hit & ~fit], fit = zp[hit & ~fit], fit | hit
            zp = np.nextafter(zp, F32(direction)).astype(F32)
    return Quantised(4, _pack4(q), d.reshape(-1), best.reshape(-1), int((~fit).sum()))


def q8_0(weight: np.ndarray) -> Quantised:
    """Symmetric int8 groups of 32 (GGUF Q8_0), stored as `q + 128` with zero point 128."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // GROUP, GROUP)
    d = (np.abs(groups).max(-1) / F32(127)).astype(F32)
    safe = np.where(d == 0, F32(1), d)[..., None]
    q = np.clip(np.round(groups / safe), -127, 127)
    unfit = int((~((q * safe).astype(F32) == groups).all(-1)).sum())
    packed = (q + 128).astype(np.uint8)
    zero = np.full(out * (inp // GROUP), 128, dtype=np.uint8)
    return Quantised(8, packed, d.reshape(-1), zero, unfit)


def _offset_nodes(
    quantised: Quantised, inp: int
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`Y = Yq + groupsum(A) · offsets`: the nodes and initialisers after `MatMulNBits`."""
    assert quantised.offsets is not None
    nodes = [
        helper.make_node("Reshape", ["A", "group_shape"], ["A_groups"]),
        helper.make_node("ReduceSum", ["A_groups", "last_axis"], ["A_sums"], keepdims=0),
        helper.make_node("MatMul", ["A_sums", "offsets"], ["Y_offsets"]),
        helper.make_node("Add", ["Yq", "Y_offsets"], ["Y"]),
    ]
    shape = np.array([-1, inp // GROUP, GROUP], dtype=np.int64)
    inits = [
        numpy_helper.from_array(shape, "group_shape"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "last_axis"),
        numpy_helper.from_array(quantised.offsets, "offsets"),
    ]
    return nodes, inits


def session(quantised: Quantised, threads: int, accuracy: int = 1) -> ort.InferenceSession:
    """`Y = A · Wᵀ` by `MatMulNBits`, float32 compute (`accuracy_level` 1), plus the offsets'
    product when the format has them."""
    out, blocks, _ = quantised.packed.shape
    inp = blocks * GROUP
    with_offsets = quantised.offsets is not None
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "scales", "zero_points"],
        ["Yq" if with_offsets else "Y"],
        domain="com.microsoft",
        K=inp,
        N=out,
        bits=quantised.bits,
        block_size=GROUP,
        accuracy_level=accuracy,
    )
    extra_nodes, extra_inits = _offset_nodes(quantised, inp) if with_offsets else ([], [])
    graph = helper.make_graph(
        [node, *extra_nodes],
        "projection",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", inp])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", out])],
        [
            numpy_helper.from_array(quantised.packed, "B"),
            numpy_helper.from_array(quantised.scales, "scales"),
            numpy_helper.from_array(quantised.zero_points, "zero_points"),
            *extra_inits,
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def ort_call(s: ort.InferenceSession) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.asarray(s.run(None, {"A": x})[0])


def bound_call(s: ort.InferenceSession, x: np.ndarray, out: int) -> Callable[[], None]:
    """`run_with_iobinding` with the input and output bound once (`OrtValue`s reused)."""
    binding = s.io_binding()
    binding.bind_cpu_input("A", x)
    y = ort.OrtValue.ortvalue_from_numpy(np.empty((x.shape[0], out), dtype=F32))
    binding.bind_ortvalue_output("Y", y)
    return lambda: s.run_with_iobinding(binding)


def dequantised(s: ort.InferenceSession, inp: int) -> np.ndarray:
    """The weights as the kernel uses them: the identity multiplied through it, `[out, in]`."""
    return ort_call(s)(np.eye(inp, dtype=F32)).T


def exact(tensors: dict[str, np.ndarray]) -> None:
    print("\n## Exactness: weights dequantised by the session vs the checkpoint's float32\n")
    print(
        "| weight | shape | format | groups | groups not exact | weights equal "
        "| max abs difference | max relative |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name, w in tensors.items():
        variants = (
            {"8-bit, zero point 128": q8_0(w)}
            if name == "lm_head"
            else {"4-bit + offsets": q4_1(w), "4-bit, float zero points": q4_1_float_zp(w)}
        )
        for label, q in variants.items():
            back = dequantised(session(q, 1), w.shape[1])
            diff = np.abs(back - w)
            rel = (diff / np.maximum(np.abs(w), F32(1e-30))).max()
            print(
                f"| {name} | {w.shape[0]} × {w.shape[1]} | {label} | {q.scales.size:,} | "
                f"{q.unfit_groups:,} | {(back == w).mean():.4%} | {diff.max():.2e} | "
                f"{rel:.1e} |"
            )


def _best_ms(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for label, call in calls.items():
            start = time.perf_counter()
            call()
            best[label] = min(best[label], (time.perf_counter() - start) * 1e3)
    return best


def speed(tensors: dict[str, np.ndarray], rounds: int, threads: list[int]) -> None:
    shapes = {
        "up 576 → 1,536": "mlp.up_proj",
        "down 1,536 → 576": "mlp.down_proj",
        "LM head 576 → 49,152": "lm_head",
    }
    rng = np.random.default_rng(0)
    for n in threads:
        torch.set_num_threads(n)
        print(
            f"\n## Speed, {n} thread(s): ms a call, best of {rounds} (load "
            f"{os.getloadavg()[0]:.1f})\n"
        )
        print(
            "| projection | rows | oneDNN fp32 | FBGEMM fp16 | ORT 4/8-bit, run | "
            "ORT, io_binding | ORT bound / fp32 | ORT bound / fp16 |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for label, name in shapes.items():
            w = tensors[name]
            q = q8_0(w) if name == "lm_head" else q4_1(w)
            s = session(q, n)
            wt = torch.from_numpy(w)
            fp32, fp16 = Fp32Linear(wt, None, packed=True), Fp16Linear(wt, None)
            for rows in ROWS:
                x = rng.standard_normal((rows, w.shape[1]), dtype=F32)
                xt, call = torch.from_numpy(x), ort_call(s)
                with torch.inference_mode():
                    ms = _best_ms(
                        {
                            "fp32": partial(fp32, xt),
                            "fp16": partial(fp16, xt),
                            "run": partial(call, x),
                            "bound": bound_call(s, x, w.shape[0]),
                        },
                        rounds if rows < 512 or name != "lm_head" else max(3, rounds // 5),
                    )
                print(
                    f"| {label} | {rows} | {ms['fp32']:.3f} | {ms['fp16']:.3f} | "
                    f"{ms['run']:.3f} | {ms['bound']:.3f} | {ms['bound'] / ms['fp32']:.2f} | "
                    f"{ms['bound'] / ms['fp16']:.2f} |",
                    flush=True,
                )


def rows(tensors: dict[str, np.ndarray], threads: list[int]) -> None:
    print(f"\n## Row independence: the first rows alone vs among {BATCH} (same call, bits)\n")
    print(
        "| weight | threads | "
        + " | ".join(f"{k} rows" for k in SUBSETS)
        + f" | {SPREAD} rows each alone, doubled | max abs vs fp32 (F.linear) | max relative "
        "| FBGEMM fp16's max abs vs fp32 |"
    )
    print("|---|---:|" + "---|" * (len(SUBSETS) + 1) + "---:|---:|---:|")
    x = np.random.default_rng(1).standard_normal((BATCH, 1536), dtype=F32)
    for name in ("mlp.up_proj", "mlp.down_proj", "self_attn.q_proj", "lm_head"):
        w = tensors[name]
        xs = np.ascontiguousarray(x[:, : w.shape[1]])
        q = q8_0(w) if name == "lm_head" else q4_1(w)
        with torch.inference_mode():
            ref = torch.nn.functional.linear(torch.from_numpy(xs), torch.from_numpy(w)).numpy()
            fp16 = Fp16Linear(torch.from_numpy(w), None)(torch.from_numpy(xs)).numpy()
        fp16_diff = np.abs(fp16 - ref).max()
        for n in threads:
            call = ort_call(session(q, n))
            full = call(xs)
            same = ["yes" if np.array_equal(call(xs[:k]), full[:k]) else "**no**" for k in SUBSETS]
            picks = range(0, BATCH, BATCH // SPREAD)
            doubled = sum(np.array_equal(call(xs[[i, i]])[0], full[i]) for i in picks)
            same.append(f"{doubled}/{len(picks)}")
            diff = np.abs(full - ref)
            print(
                f"| {name} | {n} | "
                + " | ".join(same)
                + f" | {diff.max():.2e} | {(diff.max() / np.abs(ref).max()):.1e} "
                + f"| {fp16_diff:.2e} |",
                flush=True,
            )


def model(tensors: dict[str, np.ndarray], layers: int, rounds: int, threads: list[int]) -> None:
    """Every projection of a token summed: the engine's fused shapes (QKV 960 × 576, O, gate/up
    3,072 × 576, down) of layer 0 timed and counted `layers` times, plus the LM head (fp16 in
    the ORT column: its 8-bit `MatMulNBits` has no float32 fast kernel, above)."""
    t = tensors
    fused = {
        "qkv": np.concatenate(
            [t["self_attn.q_proj"], t["self_attn.k_proj"], t["self_attn.v_proj"]]
        ),
        "o": t["self_attn.o_proj"],
        "gate_up": np.concatenate([t["mlp.gate_proj"], t["mlp.up_proj"]]),
        "down": t["mlp.down_proj"],
    }
    rng = np.random.default_rng(2)
    for n in threads:
        torch.set_num_threads(n)
        print(
            f"\n## All projections of a step, {n} thread(s): ms, {layers} layers × layer 0's "
            f"+ LM head, best of {rounds} (load {os.getloadavg()[0]:.1f})\n"
        )
        print(
            "| rows | oneDNN fp32 | FBGEMM fp16 | ORT 4-bit, bound (head fp16) | ORT 4-bit, 1 row "
            "doubled | fp32 / fp16 | fp32 / ORT | fp32 / ORT doubled | layers alone: fp32 / "
            "fp16 / ORT | LM head: fp32 / fp16 |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        kernels = {
            name: (
                Fp32Linear(torch.from_numpy(w), None, packed=True),
                Fp16Linear(torch.from_numpy(w), None),
                session(q4_1(w), n),
            )
            for name, w in fused.items()
        }
        head = torch.from_numpy(t["lm_head"])
        head32, head16 = Fp32Linear(head, None, packed=True), Fp16Linear(head, None)
        for rows in (1, 16, 256):
            x = rng.standard_normal((rows, 1536), dtype=F32)
            total = dict.fromkeys(("fp32", "fp16", "ort", "doubled"), 0.0)
            head_ms = {"fp32": 0.0, "fp16": 0.0}
            with torch.inference_mode():
                for name, (k32, k16, s) in kernels.items():
                    xs = np.ascontiguousarray(x[:, : fused[name].shape[1]])
                    xt = torch.from_numpy(xs)
                    calls: dict[str, Callable[[], object]] = {
                        "fp32": partial(k32, xt),
                        "fp16": partial(k16, xt),
                        "ort": bound_call(s, xs, fused[name].shape[0]),
                    }
                    if rows == 1:
                        twice = np.ascontiguousarray(np.repeat(xs, 2, axis=0))
                        calls["doubled"] = bound_call(s, twice, fused[name].shape[0])
                    for label, ms in _best_ms(calls, rounds).items():
                        total[label] += layers * ms
                if rows < 256:  # prefill computes the logits of its last row only
                    xt = torch.from_numpy(np.ascontiguousarray(x[:, :576]))
                    head_ms = _best_ms(
                        {"fp32": partial(head32, xt), "fp16": partial(head16, xt)}, rounds
                    )
            layers_ms = dict(total)
            total["fp32"] += head_ms["fp32"]
            for label in ("fp16", "ort", "doubled"):
                total[label] += head_ms["fp16"]
            doubled = f"{total['doubled']:.2f}" if rows == 1 else "—"
            ratio = f"{total['fp32'] / total['doubled']:.2f}×" if rows == 1 else "—"
            print(
                f"| {rows} | {total['fp32']:.2f} | {total['fp16']:.2f} | {total['ort']:.2f} | "
                f"{doubled} | {total['fp32'] / total['fp16']:.2f}× | "
                f"{total['fp32'] / total['ort']:.2f}× | {ratio} | "
                f"{layers_ms['fp32']:.2f} / {layers_ms['fp16']:.2f} / {layers_ms['ort']:.2f} | "
                f"{head_ms['fp32']:.2f} / {head_ms['fp16']:.2f} |",
                flush=True,
            )


def _each(calls: list[Callable[[], object]]) -> None:
    for call in calls:
        call()


def stream(checkpoint: Checkpoint, rounds: int, threads: list[int]) -> None:
    """What a decode step reads: every layer's own fused projections (QKV, O, gate/up, down of
    all layers, each weight read once a step, as in the model: nothing stays in cache from one
    step to the next) then the LM head, timed as one step, best of `rounds`."""
    spec, t = checkpoint.spec, checkpoint.tensors

    def fused(i: int) -> list[np.ndarray]:
        g = lambda p: t[f"model.layers.{i}.{p}.weight"].float().numpy()  # noqa: E731
        return [
            np.concatenate([g(f"self_attn.{p}_proj") for p in "qkv"]),
            g("self_attn.o_proj"),
            np.concatenate([g("mlp.gate_proj"), g("mlp.up_proj")]),
            g("mlp.down_proj"),
        ]

    weights = [w for i in range(spec.num_layers) for w in fused(i)]
    head = t["model.embed_tokens.weight"].float()
    rng = np.random.default_rng(3)
    for n in threads:
        torch.set_num_threads(n)
        k32 = [Fp32Linear(torch.from_numpy(w), None, packed=True) for w in weights]
        k16 = [Fp16Linear(torch.from_numpy(w), None) for w in weights]
        sessions = [session(q4_1(w), n) for w in weights]
        h32, h16 = Fp32Linear(head, None, packed=True), Fp16Linear(head, None)
        print(
            f"\n## A whole step's projections, weights streamed ({spec.num_layers} layers' "
            f"own, then the LM head), {n} thread(s), ms, best of {rounds} (load "
            f"{os.getloadavg()[0]:.1f})\n"
        )
        print(
            "| rows | oneDNN fp32 | FBGEMM fp16 | ORT 4-bit, bound | ORT 4-bit, 1 row doubled "
            "| LM head fp32 / fp16 | fp32 / fp16 | fp32 / ORT (head fp16) |"
        )
        print("|---:|---:|---:|---:|---:|---|---:|---:|")
        for rows in (1, 16, 256):
            x = rng.standard_normal((rows, 1536), dtype=F32)
            xs = [np.ascontiguousarray(x[:, : w.shape[1]]) for w in weights]
            xt = [torch.from_numpy(a) for a in xs]
            bound = [
                bound_call(s, a, w.shape[0]) for s, a, w in zip(sessions, xs, weights, strict=True)
            ]
            twice = [np.ascontiguousarray(np.repeat(a, 2, axis=0)) for a in xs]
            doubled = [
                bound_call(s, a, w.shape[0])
                for s, a, w in zip(sessions, twice, weights, strict=True)
            ]
            x576 = torch.from_numpy(np.ascontiguousarray(x[:, :576]))
            steps: dict[str, Callable[[], object]] = {
                "fp32": partial(_each, [partial(k, a) for k, a in zip(k32, xt, strict=True)]),
                "fp16": partial(_each, [partial(k, a) for k, a in zip(k16, xt, strict=True)]),
                "ort": partial(_each, bound),
                "h32": partial(h32, x576),
                "h16": partial(h16, x576),
            }
            if rows == 1:
                steps["doubled"] = partial(_each, doubled)
            with torch.inference_mode():
                ms = _best_ms(steps, rounds if rows < 256 else max(3, rounds // 4))
            head32, head16 = (ms["h32"], ms["h16"]) if rows < 256 else (0.0, 0.0)
            d = f"{ms['doubled']:.2f}" if rows == 1 else "—"
            print(
                f"| {rows} | {ms['fp32']:.2f} | {ms['fp16']:.2f} | {ms['ort']:.2f} | {d} | "
                f"{head32:.2f} / {head16:.2f} | "
                f"{(ms['fp32'] + head32) / (ms['fp16'] + head16):.2f}× | "
                f"{(ms['fp32'] + head32) / (ms['ort'] + head16):.2f}× |",
                flush=True,
            )


def kernels(tensors: dict[str, np.ndarray], rounds: int) -> None:
    """Which `MatMulNBits` inputs reach a fast kernel (1 thread, `run` with numpy)."""
    up, head = tensors["mlp.up_proj"], np.ascontiguousarray(tensors["lm_head"][:6144])
    exact4 = q4_1(up)
    variants = {
        "up, 4-bit + offsets (the exact format)": (exact4, 1),
        "up, 4-bit alone, integer zero point (`q·d`, without the offsets)": (
            Quantised(4, exact4.packed, exact4.scales, exact4.zero_points, 0),
            1,
        ),
        "up, 4-bit, float zero points": (q4_1_float_zp(up), 1),
        "up, 4-bit + offsets, `accuracy_level` 4 (int8 activations)": (exact4, 4),
        "6,144 rows of the LM head, 8-bit": (q8_0(head), 1),
        "6,144 rows of the LM head, 8-bit, `accuracy_level` 4": (q8_0(head), 4),
    }
    print(f"\n## Kernels: ms a call, 1 thread, best of {rounds} (load {os.getloadavg()[0]:.1f})\n")
    print("| inputs | 1 row | 16 rows |")
    print("|---|---:|---:|")
    rng = np.random.default_rng(4)
    for label, (q, accuracy) in variants.items():
        call = ort_call(session(q, 1, accuracy))
        ms = [
            _best_ms({"x": partial(call, rng.standard_normal((r, 576), dtype=F32))}, rounds)["x"]
            for r in (1, 16)
        ]
        print(f"| {label} | {ms[0]:.3f} | {ms[1]:.3f} |", flush=True)


def run(args: argparse.Namespace) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(
        f"# bench/ort_linear.py: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, onnxruntime {ort.__version__}; "
        f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
    )
    checkpoint = load_checkpoint(resolve_model(None, default_data_dir(os.environ)).directory)
    tensors = {p: checkpoint.tensors[f"{LAYER}{p}.weight"].float().numpy() for p in PROJECTIONS}
    tensors["lm_head"] = checkpoint.tensors["model.embed_tokens.weight"].float().numpy()
    threads = [int(t) for t in args.threads.split(",")]
    sections = args.sections.split(",")
    if "exact" in sections:
        exact(tensors)
    if "kernels" in sections:
        kernels(tensors, args.rounds)
    if "rows" in sections:
        rows(tensors, threads)
    if "speed" in sections:
        speed(tensors, args.rounds, threads)
    if "stream" in sections:  # 1 thread: each session's own pool spins (below)
        stream(checkpoint, args.rounds, [1])
    if "model" in sections:
        model(tensors, checkpoint.spec.num_layers, args.rounds, threads)
    print(f"\nload average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="exact,kernels,rows,speed,stream,model")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--out", type=Path, default=Path("bench/out/ort_linear"))
    args = parser.parse_args()
    tee, stdout = Tee(sys.stdout), sys.stdout
    sys.stdout = tee
    try:
        run(args)
    finally:
        sys.stdout = stdout
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(tee.getvalue())


if __name__ == "__main__":
    main()
