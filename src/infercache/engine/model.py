"""A Llama-family forward pass over KV we own (HF transformers' LlamaForCausalLM is the reference).

A step (`forward_batch`) runs several sequences at once: each `Segment` is one sequence's new
tokens at its own positions, with its own KV workspace. Their rows are stacked, so every
projection reads its weights once for the whole batch (linear.py, with `packed`); only
attention is per segment, each over its own workspace, so sequences never see each other's keys.
`forward` is a batch of one.

Per layer: RMSNorm → fused QKV projection → RoPE on Q and K at absolute positions
`start .. start+s-1` → K, V written into the workspace at those positions → attention of the
`s` new queries over workspace positions `[0, start+s)` → output projection → residual →
RMSNorm → fused gate/up projection → SiLU(gate)·up → down projection → residual.

Attention masks — the easy-to-miss part. `scaled_dot_product_attention(is_causal=True)` aligns
the causal mask top-left (query i sees keys 0..i), which is only right when there is no cached
prefix. With `start` cached tokens, query i sits at absolute position `start+i`, so it gets an
explicit mask (key j allowed iff j <= start+i). A single decode query sees every key, no mask.
Grouped-query attention: a single query folds each group's heads into the query axis (one
`[kv_heads, group, head_dim]` attention, no K/V copies); longer inputs use SDPA's `enable_gqa`.

RoPE uses the checkpoint's rope parameters (inverse frequencies and attention scaling resolved
once in `weights.py`, including linear/llama3/yarn scaling); cos/sin tables are precomputed for
every position up to `max_positions`.
Weights are the HF tensor names, read as float32 and held in the model's weight format
(weight_formats.py: the projections and the LM head in the format's kernels, the embedding
table in its lookup form); activations, norms and KV are in `dtype`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from infercache.engine.heap import return_freed_memory
from infercache.engine.kv import KVShape, KVWorkspace
from infercache.engine.linear import Projection
from infercache.engine.weight_formats import WeightFormat, weight_format
from infercache.errors import ConfigError


@dataclass(frozen=True, slots=True)
class LlamaSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    rope_inv_freq: tuple[float, ...]
    rope_attention_scaling: float

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        if len(self.rope_inv_freq) * 2 != self.head_dim:
            raise ConfigError(f"{len(self.rope_inv_freq)} rope frequencies for {self.head_dim}")


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: Projection
    o: Projection
    post_norm: torch.Tensor
    gate_up: Projection
    down: Projection


class _Weights:
    """Fetches HF-named tensors as float32 (the weight format converts them from there), with
    a clear error when absent."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def get(self, name: str) -> torch.Tensor:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ConfigError(f"checkpoint has no tensor {name!r}")
        return tensor.float().contiguous()

    def cat(self, names: list[str]) -> torch.Tensor:
        return torch.cat([self.get(n) for n in names], dim=0).contiguous()

    def bias(self, names: list[str], present: bool) -> torch.Tensor | None:
        return self.cat(names) if present else None


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin` (the same float operations), `cos` and `sin`
    holding each frequency twice: five kernels for the queries and keys of a layer at once."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaModel:
    def __init__(
        self,
        spec: LlamaSpec,
        tensors: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        max_positions: int | None = None,
        weights: WeightFormat | str = "fp32",
        packed: bool = True,
    ) -> None:
        """`weights`: the format (or its name); `packed`: steps will batch several rows (the
        fp32 format then holds its weights prepacked for that, linear.py)."""
        self.spec = spec
        self.dtype = dtype
        self.weights = weight_format(weights) if isinstance(weights, str) else weights
        self.packed = packed
        self.max_positions = max_positions or spec.max_position_embeddings
        self.kv_shape = KVShape(spec.num_layers, spec.num_kv_heads, spec.head_dim, dtype)
        with torch.inference_mode():
            w = _Weights(tensors)
            embed = w.get("model.embed_tokens.weight")
            self._embed = self.weights.embedding(embed)
            head = embed if spec.tie_word_embeddings else w.get("lm_head.weight")
            self._lm_head = self.weights.head(head, packed=packed)
            del embed, head
            self._final_norm = w.get("model.norm.weight").to(dtype)
            self._layers: list[_Layer] = []
            for i in range(spec.num_layers):
                self._layers.append(self._load_layer(w, i))
                return_freed_memory()  # this layer's float32 temporaries (heap.py)
            positions = torch.arange(self.max_positions, dtype=torch.float32)
            inv_freq = torch.tensor(spec.rope_inv_freq, dtype=torch.float32)
            freqs = positions[:, None] * inv_freq[None, :]
            freqs = torch.cat((freqs, freqs), dim=-1)
            scale = spec.rope_attention_scaling
            # [positions, 1 (heads), head_dim], broadcast over heads.
            self._cos = (freqs.cos() * scale).to(dtype)[:, None, :]
            self._sin = (freqs.sin() * scale).to(dtype)[:, None, :]
        s = spec
        self._qk_heads = s.num_heads + s.num_kv_heads
        self._group = s.num_heads // s.num_kv_heads

    def _load_layer(self, w: _Weights, i: int) -> _Layer:
        p = f"model.layers.{i}."
        attn = [f"{p}self_attn.{x}_proj" for x in ("q", "k", "v")]
        mlp = [f"{p}mlp.{x}_proj" for x in ("gate", "up")]
        bias, mlp_bias = self.spec.attention_bias, self.spec.mlp_bias

        def linear(names: list[str], has_bias: bool) -> Projection:
            weight = w.cat([f"{n}.weight" for n in names])
            b = w.bias([f"{n}.bias" for n in names], has_bias)
            return self.weights.projection(weight, b, packed=self.packed)

        return _Layer(
            input_norm=w.get(f"{p}input_layernorm.weight").to(self.dtype),
            qkv=linear(attn, bias),
            o=linear([f"{p}self_attn.o_proj"], bias),
            post_norm=w.get(f"{p}post_attention_layernorm.weight").to(self.dtype),
            gate_up=linear(mlp, mlp_bias),
            down=linear([f"{p}mlp.down_proj"], mlp_bias),
        )

    def new_workspace(self, max_tokens: int | None = None) -> KVWorkspace:
        return KVWorkspace(self.kv_shape, max_tokens or self.max_positions)

    def forward(
        self,
        token_ids: torch.Tensor,
        workspace: KVWorkspace,
        start: int,
        *,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Run `token_ids` (1-D) at positions `start..`, attending to the workspace's first
        `start` positions; extend the workspace to `start + len`. Returns float32 logits of the
        last position (`[vocab]`), or of every position (`[len, vocab]`) with `all_logits`."""
        segment = Segment(token_ids, workspace, start)
        logits = self.forward_batch([segment], all_logits=all_logits)
        return logits if all_logits else logits[0]

    def forward_batch(
        self, segments: Sequence[Segment], *, all_logits: bool = False
    ) -> torch.Tensor:
        """One step over several sequences: every segment's tokens at its own positions, over
        its own workspace. Returns float32 logits `[n, vocab]` of the last position of each
        segment that wants them (in order), or of every position with `all_logits`."""
        if not segments:
            raise ValueError("a step needs at least one segment")
        for seg in segments:
            self._check(seg)
        with torch.inference_mode():
            tokens = segments[0].token_ids if len(segments) == 1 else _cat_ids(segments)
            x = self._embed.lookup(tokens).to(self.dtype)
            rows = _Rows.of(segments, self._cos, self._sin, self.dtype)
            for index, layer in enumerate(self._layers):
                h = F.rms_norm(x, (x.shape[-1],), layer.input_norm, self.spec.rms_norm_eps)
                x = x + self._attention(layer, index, h, segments, rows)
                h = F.rms_norm(x, (x.shape[-1],), layer.post_norm, self.spec.rms_norm_eps)
                gate, up = layer.gate_up(h).chunk(2, dim=-1)
                x = x + layer.down(F.silu(gate) * up)
            for seg in segments:
                seg.workspace.length = seg.end
            if not all_logits:
                x = x[rows.wanted]
            x = F.rms_norm(x, (x.shape[-1],), self._final_norm, self.spec.rms_norm_eps)
            return self._lm_head(x).float()

    def _check(self, seg: Segment) -> None:
        s = seg.token_ids.shape[0]
        if s == 0 or seg.start > seg.workspace.length:
            raise ValueError(
                f"forward of {s} tokens at {seg.start}, workspace has {seg.workspace.length}"
            )
        if seg.end > min(seg.workspace.max_tokens, self.max_positions):
            raise ValueError(f"position {seg.end} beyond the model's {self.max_positions}")

    def _attention(
        self,
        layer: _Layer,
        index: int,
        h: torch.Tensor,
        segments: Sequence[Segment],
        rows: _Rows,
    ) -> torch.Tensor:
        """QKV and the output projection over every row at once; attention per segment, each
        over its own workspace (the keys of different sequences never mix)."""
        spec = self.spec
        t = h.shape[0]
        qkv = layer.qkv(h)
        width = self._qk_heads * spec.head_dim
        qk = _rope(qkv[:, :width].view(t, self._qk_heads, spec.head_dim), rows.cos, rows.sin)
        q, k = qk[:, : spec.num_heads], qk[:, spec.num_heads :]
        v = qkv[:, width:].view(t, spec.num_kv_heads, spec.head_dim)
        if len(segments) == 1:
            out = self._attend(segments[0], index, q, k, v, rows.masks[0])
        else:
            out = torch.empty((t, spec.num_heads * spec.head_dim), dtype=h.dtype)
            for seg, (a, b), mask in zip(segments, rows.bounds, rows.masks, strict=True):
                out[a:b] = self._attend(seg, index, q[a:b], k[a:b], v[a:b], mask)
        return layer.o(out)

    def _attend(
        self,
        seg: Segment,
        index: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """One sequence's queries over its workspace, after writing its new K and V there."""
        spec = self.spec
        s, start, end = q.shape[0], seg.start, seg.end
        kv = seg.workspace.data[index]
        kv[0, start:end] = k
        kv[1, start:end] = v
        keys = kv[0, :end].transpose(0, 1).unsqueeze(0)  # [1, kv_heads, end, head_dim]
        values = kv[1, :end].transpose(0, 1).unsqueeze(0)
        if s == 1:
            grouped = q.view(1, spec.num_kv_heads, self._group, spec.head_dim)
            out = F.scaled_dot_product_attention(grouped, keys, values)
            return out.reshape(1, spec.num_heads * spec.head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            keys,
            values,
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=self._group > 1,
        )
        return out[0].transpose(0, 1).reshape(s, spec.num_heads * spec.head_dim)


@dataclass(frozen=True, slots=True)
class Segment:
    """One sequence's share of a step: `token_ids` (1-D int64) at positions `start..`, whose
    K/V go to `workspace`, attending to its first `start` positions. `wants_logits`: whether
    the step returns logits for its last position (a prefill chunk that does not end the
    prompt needs none)."""

    token_ids: torch.Tensor
    workspace: KVWorkspace
    start: int
    wants_logits: bool = True

    @property
    def end(self) -> int:
        return self.start + self.token_ids.shape[0]


def _cat_ids(segments: Sequence[Segment]) -> torch.Tensor:
    return torch.cat([seg.token_ids for seg in segments])


@dataclass(frozen=True, slots=True)
class _Rows:
    """Where each segment's rows sit in the step's flattened batch, with the per-row RoPE
    tables, each segment's attention mask, and the rows whose logits are returned."""

    bounds: list[tuple[int, int]]
    cos: torch.Tensor
    sin: torch.Tensor
    masks: list[torch.Tensor | None]
    wanted: list[int]

    @classmethod
    def of(
        cls, segments: Sequence[Segment], cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
    ) -> _Rows:
        bounds, masks, wanted, ranges = [], [], [], []
        row = 0
        for seg in segments:
            s = seg.token_ids.shape[0]
            bounds.append((row, row + s))
            ranges.append((seg.start, seg.end))
            masks.append(_mask(seg.start, seg.end, dtype))
            if seg.wants_logits:
                wanted.append(row + s - 1)
            row += s
        if len(segments) == 1:
            ((start, end),) = ranges
            return cls(bounds, cos[start:end], sin[start:end], masks, wanted)
        positions = torch.cat([torch.arange(a, b) for a, b in ranges])
        return cls(bounds, cos[positions], sin[positions], masks, wanted)


def _mask(start: int, end: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The attention mask of queries at `start..end` over keys `0..end`. None when SDPA's
    top-left causal mask is right (no cached prefix) or no mask is needed (one query)."""
    s = end - start
    if s == 1 or start == 0:
        return None
    # Additive (0 / -inf) rather than boolean: the same result, and SDPA's CPU kernel applies
    # it faster.
    keys = torch.arange(end)
    future = keys[None, :] > keys[start:end, None]
    return torch.zeros((s, end), dtype=dtype).masked_fill_(future, -torch.inf)
