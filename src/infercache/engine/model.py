"""A Llama-family forward pass over KV we own (HF transformers' LlamaForCausalLM is the reference).

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
Weights are the HF tensor names; tied embeddings share one tensor with the LM head.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from infercache.engine.kv import KVShape, KVWorkspace
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
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_weight: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None


class _Weights:
    """Fetches HF-named tensors, cast to the compute dtype, with a clear error when absent."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> None:
        self._tensors = tensors
        self._dtype = dtype

    def get(self, name: str) -> torch.Tensor:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ConfigError(f"checkpoint has no tensor {name!r}")
        return tensor.to(self._dtype).contiguous()

    def cat(self, names: list[str]) -> torch.Tensor:
        return torch.cat([self.get(n) for n in names], dim=0).contiguous()

    def bias(self, names: list[str], present: bool) -> torch.Tensor | None:
        return self.cat(names) if present else None


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin` on halves: the same float operations."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaModel:
    def __init__(
        self,
        spec: LlamaSpec,
        tensors: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        max_positions: int | None = None,
    ) -> None:
        self.spec = spec
        self.dtype = dtype
        self.max_positions = max_positions or spec.max_position_embeddings
        self.kv_shape = KVShape(spec.num_layers, spec.num_kv_heads, spec.head_dim, dtype)
        with torch.inference_mode():
            w = _Weights(tensors, dtype)
            self._embed = w.get("model.embed_tokens.weight")
            self._lm_head = self._embed if spec.tie_word_embeddings else w.get("lm_head.weight")
            self._final_norm = w.get("model.norm.weight")
            self._layers = [self._load_layer(w, i) for i in range(spec.num_layers)]
            positions = torch.arange(self.max_positions, dtype=torch.float32)
            inv_freq = torch.tensor(spec.rope_inv_freq, dtype=torch.float32)
            freqs = positions[:, None] * inv_freq[None, :]
            scale = spec.rope_attention_scaling
            # [positions, 1 (heads), head_dim / 2], broadcast over heads.
            self._cos = (freqs.cos() * scale).to(dtype)[:, None, :]
            self._sin = (freqs.sin() * scale).to(dtype)[:, None, :]
        s = spec
        self._qkv_sizes = [s.num_heads * s.head_dim, *[s.num_kv_heads * s.head_dim] * 2]
        self._group = s.num_heads // s.num_kv_heads

    def _load_layer(self, w: _Weights, i: int) -> _Layer:
        p = f"model.layers.{i}."
        attn = [f"{p}self_attn.{x}_proj" for x in ("q", "k", "v")]
        mlp = [f"{p}mlp.{x}_proj" for x in ("gate", "up")]
        return _Layer(
            input_norm=w.get(f"{p}input_layernorm.weight"),
            qkv_weight=w.cat([f"{n}.weight" for n in attn]),
            qkv_bias=w.bias([f"{n}.bias" for n in attn], self.spec.attention_bias),
            o_weight=w.get(f"{p}self_attn.o_proj.weight"),
            o_bias=w.bias([f"{p}self_attn.o_proj.bias"], self.spec.attention_bias),
            post_norm=w.get(f"{p}post_attention_layernorm.weight"),
            gate_up_weight=w.cat([f"{n}.weight" for n in mlp]),
            gate_up_bias=w.bias([f"{n}.bias" for n in mlp], self.spec.mlp_bias),
            down_weight=w.get(f"{p}mlp.down_proj.weight"),
            down_bias=w.bias([f"{p}mlp.down_proj.bias"], self.spec.mlp_bias),
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
        s = token_ids.shape[0]
        end = start + s
        if s == 0 or start > workspace.length:
            raise ValueError(f"forward of {s} tokens at {start}, workspace has {workspace.length}")
        if end > min(workspace.max_tokens, self.max_positions):
            raise ValueError(f"position {end} beyond the model's {self.max_positions}")
        with torch.inference_mode():
            x = F.embedding(token_ids, self._embed)
            cos, sin = self._cos[start:end], self._sin[start:end]
            mask = None
            if s > 1 and start > 0:
                # Additive (0 / -inf) rather than boolean: the same result, and SDPA's CPU
                # kernel applies it faster.
                keys = torch.arange(end)
                future = keys[None, :] > keys[start:end, None]
                mask = torch.zeros((s, end), dtype=self.dtype).masked_fill_(future, -torch.inf)
            for layer, kv in zip(self._layers, workspace.data, strict=True):
                h = F.rms_norm(x, (x.shape[-1],), layer.input_norm, self.spec.rms_norm_eps)
                x = x + self._attention(layer, h, kv, start, cos, sin, mask)
                h = F.rms_norm(x, (x.shape[-1],), layer.post_norm, self.spec.rms_norm_eps)
                gate, up = F.linear(h, layer.gate_up_weight, layer.gate_up_bias).chunk(2, dim=-1)
                x = x + F.linear(F.silu(gate) * up, layer.down_weight, layer.down_bias)
            workspace.length = end
            x = x if all_logits else x[-1:]
            x = F.rms_norm(x, (x.shape[-1],), self._final_norm, self.spec.rms_norm_eps)
            logits = F.linear(x, self._lm_head).float()
        return logits if all_logits else logits[0]

    def _attention(
        self,
        layer: _Layer,
        h: torch.Tensor,
        kv: torch.Tensor,
        start: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        s, spec = h.shape[0], self.spec
        end = start + s
        qkv = F.linear(h, layer.qkv_weight, layer.qkv_bias)
        q, k, v = torch.split(qkv, self._qkv_sizes, dim=-1)
        q = _rope(q.view(s, spec.num_heads, spec.head_dim), cos, sin)
        kv[0, start:end] = _rope(k.view(s, spec.num_kv_heads, spec.head_dim), cos, sin)
        kv[1, start:end] = v.view(s, spec.num_kv_heads, spec.head_dim)
        keys = kv[0, :end].transpose(0, 1).unsqueeze(0)  # [1, kv_heads, end, head_dim]
        values = kv[1, :end].transpose(0, 1).unsqueeze(0)
        if s == 1:
            grouped = q.view(1, spec.num_kv_heads, self._group, spec.head_dim)
            out = F.scaled_dot_product_attention(grouped, keys, values)
            out = out.reshape(1, spec.num_heads * spec.head_dim)
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0),
                keys,
                values,
                attn_mask=mask,
                is_causal=mask is None,
                enable_gqa=self._group > 1,
            )
            out = out[0].transpose(0, 1).reshape(s, spec.num_heads * spec.head_dim)
        return F.linear(out, layer.o_weight, layer.o_bias)
