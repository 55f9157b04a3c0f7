"""Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-Linear) over its compressed KV cache, decoded as
serving engines decode it (the weight-absorbed form of vLLM's / SGLang's MLA backends, FlashMLA).

Per token the layer caches one normed latent c [kv_lora_rank] and one rope key k_pe [qk_rope_head_dim] shared
by every head: kv_lora_rank + qk_rope_head_dim elements per token and layer (Kimi-Linear: 512 + 64), whole on
every TP rank. The heads' keys and values are never materialised:

    q          = W_q h                                   [batch, T, heads, qk_nope + qk_rope]   (q_lora_rank
                                                          None; else W_qb rms_norm(W_qa h))
    c, k_pe    = W_kva h; c = rms_norm(c)                 written at each row's cursor (the shared `lengths`)
    q_lat      = q_nope W_uk (per head)                   [batch, T, heads, kv_lora_rank]: absorbs the key up-proj
    scores     = (q_lat . c + q_pe . k_pe) / sqrt(qk_nope + qk_rope)   over the cache, causal in the window
    o_lat      = softmax(scores) c                        [batch, T, heads, kv_lora_rank]
    out        = W_o (o_lat W_uv per head)                W_uk, W_uv: kv_b_proj [heads x (qk_nope + v), rank]

which equals attention with k = [c W_uk^T, k_pe], v = c W_uv^T per head (tests check it in float64). RoPE on
q_pe / k_pe is an elementwise op; Kimi-Linear runs without it (mla_use_nope) and it is left out here for every
model alike, as for the GQA layer. Rejected window tokens are rolled back by not advancing the cursor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from experiments.hybrid.layers import _w, randn, rms_norm
from experiments.hybrid.spec import HybridSpec


class MLAAttention:
    """MLA over a contiguous latent cache [slots, capacity, kv_lora_rank + qk_rope_head_dim]; `lengths` [slots] is
    the model-wide cursor (shared with every attention layer), `bound[0]` its host-side maximum."""

    def __init__(self, spec: HybridSpec, num_slots: int, capacity: int, lengths: torch.Tensor, bound: list[int],
                 gen: torch.Generator, act: torch.dtype, device: str):
        a, d = spec.attention, spec.hidden

        def weight(*shape: int, fan_in: int) -> torch.Tensor:
            return _w(gen, *shape, fan_in=fan_in, dtype=act, device=device)

        if a.kind != "mla":
            raise ValueError(f"MLAAttention needs attention.kind=mla, got {a.kind!r}")
        self.a, self.lengths, self.bound = a, lengths, bound
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        self.scale = 1.0 / math.sqrt(qk)           # the softmax scale of the un-absorbed q.k head dim
        if a.q_lora_rank:
            self.w_qa = weight(a.q_lora_rank, d, fan_in=d)
            self.q_norm = torch.ones(a.q_lora_rank, dtype=act, device=device)
            self.w_q = weight(a.num_heads * qk, a.q_lora_rank, fan_in=a.q_lora_rank)
        else:
            self.w_qa = self.q_norm = None
            self.w_q = weight(a.num_heads * qk, d, fan_in=d)
        self.w_kva = weight(a.kv_lora_rank + a.qk_rope_head_dim, d, fan_in=d)
        self.kv_norm = torch.ones(a.kv_lora_rank, dtype=act, device=device)
        # kv_b_proj [heads x (qk_nope + v), rank], kept split per head for the absorbed decode
        kvb = weight(a.num_heads, a.qk_nope_head_dim + a.v_head_dim, a.kv_lora_rank, fan_in=a.kv_lora_rank)
        self.w_uk = kvb[:, :a.qk_nope_head_dim].contiguous()          # [heads, qk_nope, rank]
        self.w_uv = kvb[:, a.qk_nope_head_dim:].contiguous()          # [heads, v, rank]
        self.w_out = weight(d, a.num_heads * a.v_head_dim, fan_in=a.num_heads * a.v_head_dim)
        self.cache = torch.zeros(num_slots, capacity, a.kv_token_elems, dtype=act, device=device)

    def reset(self, gen: torch.Generator, context: int) -> None:
        """Random prefill latents for `context` tokens of every slot (the latent part normed, as written)."""
        r = self.a.kv_lora_rank
        self.cache[:, :context].copy_(randn(gen, self.cache[:, :context].shape, self.cache.device))
        self.cache[:, :context, :r] = rms_norm(self.cache[:, :context, :r], self.kv_norm)

    def nbytes(self) -> int:
        return self.cache.numel() * self.cache.element_size()

    def weight_bytes(self) -> int:
        ts = [self.w_q, self.w_kva, self.kv_norm, self.w_uk, self.w_uv, self.w_out]
        ts += [t for t in (self.w_qa, self.q_norm) if t is not None]
        return sum(t.numel() * t.element_size() for t in ts)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        a = self.a
        b, T, _ = h.shape
        r, nope = a.kv_lora_rank, a.qk_nope_head_dim
        x = rms_norm(F.linear(h, self.w_qa), self.q_norm) if self.w_qa is not None else h
        q = F.linear(x, self.w_q).reshape(b, T, a.num_heads, nope + a.qk_rope_head_dim)
        q_nope, q_pe = q.split([nope, a.qk_rope_head_dim], dim=-1)
        kv = F.linear(h, self.w_kva)
        entry = torch.cat([rms_norm(kv[..., :r], self.kv_norm), kv[..., r:]], dim=-1)    # [batch, T, r + rope]
        pos = self.lengths[:b, None] + torch.arange(T, device=h.device)                   # [batch, T]
        rows = torch.arange(b, device=h.device)[:, None].expand(b, T)
        self.cache[rows, pos] = entry
        q_lat = torch.einsum("bthn,hnr->bhtr", q_nope, self.w_uk)                        # absorb W_uk
        query = torch.cat([q_lat, q_pe.transpose(1, 2)], dim=-1)                          # [batch, heads, T, r+rope]
        span = self.bound[0] + T                                                          # keys read: <= every cursor
        keys = self.cache[:b, :span].unsqueeze(1)                                         # [batch, 1, span, r+rope]
        mask = torch.arange(span, device=h.device)[None, None, :] <= pos[:, :, None]      # causal in the window
        o_lat = F.scaled_dot_product_attention(query, keys, keys[..., :r], attn_mask=mask[:, None],
                                               scale=self.scale, enable_gqa=True)         # [batch, heads, T, r]
        out = torch.einsum("bhtr,hvr->bthv", o_lat, self.w_uv)                            # absorb W_uv
        return F.linear(out.reshape(b, T, a.num_heads * a.v_head_dim), self.w_out)

    def advance(self, accepted: torch.Tensor) -> None:
        """The model advances the shared cursor once for all attention layers."""
