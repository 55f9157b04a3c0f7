"""The sub-layers of a hybrid decode step, as serving engines run them, with random weights at real dims.

Every sub-layer takes the residual stream h [batch, T, hidden] (T = 1 for decode, the window for a
speculative verify) and returns its update; `advance(accepted)` moves its per-sequence cursors forward
by `accepted` [batch] tokens (AR: 1). Rows map to cache slots 0..batch-1 (identity; the slot pool itself
is exercised by the kernel experiments).

    SSMMixer   (Mamba-2, GDN, KDA) in_proj GEMM -> causal conv1d over (conv state ++ window) -> the SSM
               method under test (the harness registry's step / verify+commit) -> gated RMSNorm -> out_proj.
               The conv state keeps the last conv_kernel-1 inputs; a verify does not touch it, `advance`
               shifts in the accepted prefix (the rejected tokens are never written: rollback is free).
    Attention  fused QKV GEMM -> write K, V at each row's length cursor -> SDPA over the cache (causal in
               the window) -> out_proj. Contiguous KV cache [slots, capacity, kv_heads, head_dim]; the
               rejected tokens' entries are rolled back by not advancing the cursor. No RoPE (Nemotron-H's
               attention has none; for Qwen it is an elementwise op on q, k, left out of every method alike).
               MLA (multi-head latent attention, Kimi-Linear) is experiments/hybrid/mla.py: a compressed cache.
    MLP        relu2 (up -> relu^2 -> down) or SwiGLU (gate_up -> silu(gate) * up -> down).
    MoE        router -> top-k (renormalised softmax) -> experts by torch.nn.functional.grouped_mm over
               expert-sorted tokens when torch has it, else an honest per-expert loop (`impl` says which);
               optional latent projection (LatentMoE) and shared expert.
SSM outputs are allocated NaN-poisoned (a method that skips part of its output poisons the logits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from experiments.harness.methods import REGISTRY
from experiments.hybrid.spec import HybridSpec
from replayssm.ring_cursors import attach

ATTENTION_IMPL = "torch_sdpa"
KV_LAYOUT = "contiguous"


def randn(gen: torch.Generator, shape, device) -> torch.Tensor:
    """Standard normal values, reproducible from the CPU generator `gen`. On a GPU they are drawn there from a
    seed taken from `gen` (a 4B model's weights drawn on one host core took minutes per build); on the CPU
    they come from `gen` itself, as before. Same `gen` state, same values: every method of a point's model
    sees the same weights."""
    if torch.device(device).type == "cpu":
        return torch.randn(shape, generator=gen)
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    return torch.randn(shape, generator=torch.Generator(device).manual_seed(seed), device=device)


def _w(gen: torch.Generator, *shape: int, fan_in: int, dtype, device) -> torch.Tensor:
    """Random weights with std 1/sqrt(fan_in), reproducible from the CPU generator (see `randn`)."""
    return (randn(gen, shape, device) / math.sqrt(fan_in)).to(device=device, dtype=dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


# ------------------------------------------------------------------------------------------------ SSM

@dataclass
class SSMCall:
    """What a registry method reads from a harness Point / Workload (the same fields, nothing else)."""

    family: str
    backend: str
    geometry: object
    state_dtype: torch.dtype
    act_dtype: torch.dtype
    route: str | None = None
    buffer_len: int | None = None
    spec_T: int | None = None
    history_len: int | None = None

    @property
    def state_shape(self) -> tuple[int, ...]:
        g = self.geometry
        return (g.nheads, g.headdim, g.dstate) if self.family == "mamba2" else (g.HV, g.V, g.K)


class SSMMixer:
    """One Mamba-2, GDN or KDA mixer layer with its conv state and the SSM cache of `method` for `num_slots` rows.
    KDA (Kimi-Linear) differs from GDN in its projections only: the decay g [batch, T, HV, K] is per key channel,
    from a low-rank leg (f_a -> f_b) plus dt_bias [HV x K], and the output gate is a sigmoid after the norm."""

    def __init__(self, spec: HybridSpec, method: str, call: SSMCall, num_slots: int, gen: torch.Generator,
                 device: str, cursor=None):
        self.spec, self.call, self.device = spec, call, device
        self.method = REGISTRY[method]
        if spec.family not in self.method.families:
            raise ValueError(f"method {method!r} has no {spec.family} implementation")
        self.fns = self.method.api(spec.family)
        g, d, act = spec.geometry, spec.hidden, call.act_dtype
        if spec.family == "mamba2":
            self.inner = g.nheads * g.headdim
            self.conv_dim = self.inner + 2 * g.ngroups * g.dstate        # x, B, C go through the conv
            self.split = [self.inner, self.conv_dim, g.nheads]            # z | xBC | dt
            from replayssm.mamba2.inputs import random_params  # deferred: the package loads its Triton kernels

            prm = random_params(g, device=device, generator=gen)
            self.A, self.D, self.dt_bias = prm.A, prm.D, prm.dt_bias
            self.norm_groups = g.ngroups
        else:
            self.inner = g.HV * g.V
            self.conv_dim = 2 * g.H * g.K + self.inner                   # q, k, v go through the conv
            self.A_log = torch.empty(g.HV).uniform_(0.0, 2.77, generator=gen).log().to(device)
            self.A = None
            self.norm_groups = g.HV
            if spec.family == "gdn":
                self.split = [self.conv_dim, self.inner, g.HV, g.HV]       # qkv | z | b | a
                self.dt_bias = torch.randn(g.HV, generator=gen).to(device)
            else:   # KDA (vLLM's KimiGatedDeltaNetAttention): qkv | f_a [K] | b [HV] | g_a [V], low-rank legs
                self.split = [self.conv_dim, g.K, g.HV, g.V]
                self.dt_bias = torch.randn(g.HV * g.K, generator=gen).to(device)          # per key channel
                self.w_fb = _w(gen, g.HV * g.K, g.K, fan_in=g.K, dtype=act, device=device)   # decay, [HV, K]
                self.w_gb = _w(gen, self.inner, g.V, fan_in=g.V, dtype=act, device=device)  # output gate
        self.w_in = _w(gen, sum(self.split), d, fan_in=d, dtype=act, device=device)
        self.conv_w = _w(gen, self.conv_dim, spec.conv_kernel, fan_in=spec.conv_kernel, dtype=act, device=device)
        self.conv_b = torch.zeros(self.conv_dim, dtype=act, device=device)
        self.norm_w = torch.ones(self.inner, dtype=act, device=device)
        self.w_out = _w(gen, d, self.inner, fan_in=self.inner, dtype=act, device=device)
        self.conv_state = torch.zeros(num_slots, spec.conv_kernel - 1, self.conv_dim, dtype=act, device=device)
        self.cache = self.method.allocate(call, call, num_slots, device)
        if cursor is not None:            # one cursor per row for every layer (HybridModel moves it once a step)
            attach(self.cache, cursor)
        self.pending: torch.Tensor | None = None      # the window's conv inputs, shifted in by `advance`

    def reset(self, gen: torch.Generator) -> None:
        """A prefill-like state: random SSM state (committed), random conv state, cursors at 0."""
        g, shape = self.spec.geometry, self.call.state_shape
        std = 1.0 if self.spec.family == "mamba2" else g.K ** -0.5
        n = self.conv_state.shape[0]
        state = (randn(gen, (n, *shape), self.device) * std).to(self.device, self.call.state_dtype)
        self.method.set_state(self.cache, state)
        self.conv_state.copy_(randn(gen, self.conv_state.shape, self.device))

    def nbytes(self) -> int:
        return int(self.method.footprint(self.cache)) + self.conv_state.numel() * self.conv_state.element_size()

    def weight_bytes(self) -> int:
        ts = [self.w_in, self.conv_w, self.conv_b, self.norm_w, self.w_out]
        ts += [self.w_fb, self.w_gb] if self.spec.family == "kda" else []
        return sum(t.numel() * t.element_size() for t in ts)

    def _conv(self, xbc: torch.Tensor) -> torch.Tensor:
        """Causal depthwise conv over (conv state ++ window) [batch, K-1+T, conv_dim] -> SiLU [batch, T, conv_dim]."""
        b, T, _ = xbc.shape
        full = torch.cat([self.conv_state[:b], xbc], dim=1)
        windows = full.unfold(1, self.spec.conv_kernel, 1)              # [batch, T, conv_dim, K]
        return F.silu((windows * self.conv_w).sum(-1) + self.conv_b)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        b, T, _ = h.shape
        proj = F.linear(h, self.w_in)
        parts = torch.split(proj, self.split, dim=-1)
        g, spec = self.spec.geometry, self.spec
        if spec.family == "mamba2":
            z, xbc, dt = parts
            self.pending = xbc
            xbc = self._conv(xbc)
            x, B, C = torch.split(xbc, [self.inner, g.ngroups * g.dstate, g.ngroups * g.dstate], dim=-1)
            kw = dict(x=x.reshape(b, T, g.nheads, g.headdim), dt=dt, A=self.A,
                      B=B.reshape(b, T, g.ngroups, g.dstate), C=C.reshape(b, T, g.ngroups, g.dstate), D=self.D,
                      z=z.reshape(b, T, g.nheads, g.headdim) if spec.has_z else None, dt_bias=self.dt_bias,
                      dt_softplus=spec.dt_softplus)
            out_shape = (g.nheads, g.headdim)
        elif spec.family == "kda":
            qkv, f_a, beta_raw, z = parts
            self.pending = qkv
            qkv = self._conv(qkv)
            q, k, v = torch.split(qkv, [g.H * g.K, g.H * g.K, self.inner], dim=-1)
            f = F.linear(f_a, self.w_fb).float().reshape(b, T, g.HV, g.K) + self.dt_bias.reshape(g.HV, g.K)
            gate = -torch.exp(self.A_log)[:, None] * F.softplus(f)          # FLA's KDA gate, [batch, T, HV, K]
            z = F.linear(z, self.w_gb)                                      # the output gate (sigmoid, below)
            kw = dict(q=q.reshape(b, T, g.H, g.K), k=k.reshape(b, T, g.H, g.K), v=v.reshape(b, T, g.HV, g.V),
                      g=gate, beta=torch.sigmoid(beta_raw.float()), scale=None, use_qk_l2norm=spec.use_qk_l2norm)
            out_shape = (g.HV, g.V)
        else:
            qkv, z, beta_raw, a = parts
            self.pending = qkv
            qkv = self._conv(qkv)
            q, k, v = torch.split(qkv, [g.H * g.K, g.H * g.K, self.inner], dim=-1)
            gate = -torch.exp(self.A_log) * F.softplus(a.float() + self.dt_bias)
            kw = dict(q=q.reshape(b, T, g.H, g.K), k=k.reshape(b, T, g.H, g.K), v=v.reshape(b, T, g.HV, g.V),
                      g=gate, beta=torch.sigmoid(beta_raw.float()), scale=None, use_qk_l2norm=spec.use_qk_l2norm)
            out_shape = (g.HV, g.V)
        if self.method.kind == "ar":
            if T != 1:
                raise ValueError(f"an AR method ({self.method.name}) decodes one token per row, got a window of {T}")
            kw = {k: (v[:, 0].contiguous() if isinstance(v, torch.Tensor) and v.dim() > 1 else v)
                  for k, v in kw.items()}
            out = torch.full((b, *out_shape), float("nan"), dtype=self.call.act_dtype, device=h.device)
            y = self.method.step(self.fns, self.cache, self.call, kw, None, out)
        else:
            kw = {k: (v.contiguous() if isinstance(v, torch.Tensor) and v.dim() > 1 else v) for k, v in kw.items()}
            out = torch.full((b, T, *out_shape), float("nan"), dtype=self.call.act_dtype, device=h.device)
            y = self.method.verify(self.fns, self.cache, self.call, kw, None, out)
        y = (out if y is None else y).reshape(b, T, self.inner)
        if spec.family == "kda":      # Kimi's o_norm: RMSNorm per head, then the sigmoid output gate
            y = rms_norm(y.reshape(b, T, g.HV, -1), None).reshape(b, T, self.inner) * self.norm_w
            return F.linear(y * torch.sigmoid(z), self.w_out)
        zg = z if spec.family == "gdn" or not spec.has_z else None     # with has_z the SSM already gated
        if zg is not None:
            y = y * F.silu(zg)
        y = rms_norm(y.reshape(b, T, self.norm_groups, -1), None).reshape(b, T, self.inner) * self.norm_w
        return F.linear(y, self.w_out)

    def advance(self, accepted: torch.Tensor) -> None:
        """Commit `accepted` [batch] tokens of the last window: SSM commit (spec methods) and conv shift."""
        b = accepted.shape[0]
        if self.method.kind == "spec" and not getattr(self.cache, "shared_cursor", False):
            self.method.commit(self.fns, self.cache, self.call, accepted.to(torch.int32), None, self.A)
        full = torch.cat([self.conv_state[:b], self.pending], dim=1)        # [batch, K-1+T, conv_dim]
        idx = accepted.long()[:, None] + torch.arange(self.spec.conv_kernel - 1, device=accepted.device)
        self.conv_state[:b] = full.gather(1, idx[..., None].expand(-1, -1, self.conv_dim))


# ----------------------------------------------------------------------------------------- attention

class Attention:
    """GQA attention over a contiguous KV cache; `lengths` [slots] is the model-wide cursor (shared)."""

    def __init__(self, spec: HybridSpec, num_slots: int, capacity: int, lengths: torch.Tensor, bound: list[int],
                 gen: torch.Generator, act: torch.dtype, device: str):
        a, d = spec.attention, spec.hidden
        self.a, self.lengths, self.bound = a, lengths, bound     # bound[0]: host-side max length (no sync)
        q = a.num_heads * (2 if a.output_gate else 1)            # Qwen3.5's output gate: one more head-sized output
        self.w_qkv = _w(gen, (q + 2 * a.num_kv_heads) * a.head_dim, d, fan_in=d, dtype=act, device=device)
        self.w_out = _w(gen, d, a.num_heads * a.head_dim, fan_in=a.num_heads * a.head_dim, dtype=act, device=device)
        self.k = torch.zeros(num_slots, capacity, a.num_kv_heads, a.head_dim, dtype=act, device=device)
        self.v = torch.zeros_like(self.k)

    def reset(self, gen: torch.Generator, context: int) -> None:
        self.k[:, :context].copy_(randn(gen, self.k[:, :context].shape, self.k.device))
        self.v[:, :context].copy_(randn(gen, self.v[:, :context].shape, self.v.device))

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w_qkv, self.w_out))

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        a = self.a
        b, T, _ = h.shape
        q, k, v = torch.split(F.linear(h, self.w_qkv), [a.num_heads * a.head_dim * (2 if a.output_gate else 1),
                                                        a.num_kv_heads * a.head_dim, a.num_kv_heads * a.head_dim],
                              dim=-1)
        gate = None
        if a.output_gate:
            q, gate = q.reshape(b, T, a.num_heads, 2 * a.head_dim).chunk(2, dim=-1)
        pos = self.lengths[:b, None] + torch.arange(T, device=h.device)               # [batch, T]
        rows = torch.arange(b, device=h.device)[:, None].expand(b, T)
        self.k[rows, pos] = k.reshape(b, T, a.num_kv_heads, a.head_dim)
        self.v[rows, pos] = v.reshape(b, T, a.num_kv_heads, a.head_dim)
        span = self.bound[0] + T                                                         # keys read: <= every cursor
        keys = torch.arange(span, device=h.device)
        mask = keys[None, None, :] <= pos[:, :, None]                                    # causal in the window
        out = F.scaled_dot_product_attention(
            q.reshape(b, T, a.num_heads, a.head_dim).transpose(1, 2),
            self.k[:b, :span].transpose(1, 2), self.v[:b, :span].transpose(1, 2),
            attn_mask=mask[:, None], enable_gqa=a.num_heads != a.num_kv_heads)
        out = out.transpose(1, 2)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return F.linear(out.reshape(b, T, -1), self.w_out)

    def advance(self, accepted: torch.Tensor) -> None:
        """The model advances the shared cursor once for all attention layers."""


# ------------------------------------------------------------------------------------------- MLP / MoE

def _act(act: str, x: torch.Tensor) -> torch.Tensor:
    if act == "relu2":
        return torch.relu(x).square()
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class MLP:
    def __init__(self, spec: HybridSpec, gen: torch.Generator, act: torch.dtype, device: str,
                 inter: int | None = None, width: int | None = None):
        m = spec.mlp
        d, self.act = width or spec.hidden, m.act
        inter = inter or m.intermediate
        up = 2 * inter if m.act == "swiglu" else inter
        self.w_up = _w(gen, up, d, fan_in=d, dtype=act, device=device)
        self.w_down = _w(gen, d, inter, fan_in=inter, dtype=act, device=device)

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w_up, self.w_down))

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(_act(self.act, F.linear(h, self.w_up)), self.w_down)

    def advance(self, accepted: torch.Tensor) -> None:
        pass


def grouped_mm_available() -> bool:
    return hasattr(F, "grouped_mm")


class MoE:
    def __init__(self, spec: HybridSpec, gen: torch.Generator, act: torch.dtype, device: str, impl: str = "auto"):
        m = spec.mlp
        self.m, d = m, spec.hidden
        self.width = m.latent or d
        inter = m.expert_intermediate
        up = 2 * inter if m.act == "swiglu" else inter
        self.router = _w(gen, m.num_experts, d, fan_in=d, dtype=torch.float32, device=device)
        self.w_up = _w(gen, m.num_experts, self.width, up, fan_in=self.width, dtype=act, device=device)   # [E, d, up]
        self.w_down = _w(gen, m.num_experts, inter, self.width, fan_in=inter, dtype=act, device=device)
        self.lat_in = _w(gen, m.latent, d, fan_in=d, dtype=act, device=device) if m.latent else None
        self.lat_out = _w(gen, d, m.latent, fan_in=m.latent, dtype=act, device=device) if m.latent else None
        self.shared = MLP(spec, gen, act, device, inter=m.shared_intermediate) if m.shared_intermediate else None
        if impl == "auto":
            impl = "grouped_mm" if grouped_mm_available() else "loop"
        if impl not in ("grouped_mm", "loop"):
            raise ValueError(f"moe impl: expected auto, grouped_mm or loop, got {impl!r}")
        self.impl = impl

    def weight_bytes(self) -> int:
        ts = [self.router, self.w_up, self.w_down] + [t for t in (self.lat_in, self.lat_out) if t is not None]
        return sum(t.numel() * t.element_size() for t in ts) + (self.shared.weight_bytes() if self.shared else 0)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        m = self.m
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        top_w, top_e = torch.topk(F.linear(x.float(), self.router), m.top_k, dim=-1)
        top_w = torch.softmax(top_w, dim=-1).to(x.dtype)                              # [N, k]
        xin = F.linear(x, self.lat_in) if self.lat_in is not None else x
        flat_e = top_e.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        token = order // m.top_k
        xs = xin[token]                                                                 # expert-sorted copies
        counts = torch.bincount(flat_e, minlength=m.num_experts)
        if self.impl == "grouped_mm":
            offs = torch.cumsum(counts, 0).to(torch.int32)
            ys = F.grouped_mm(_act(m.act, F.grouped_mm(xs, self.w_up, offs=offs)), self.w_down, offs=offs)
        else:
            ys = torch.empty(xs.shape[0], self.width, dtype=xs.dtype, device=xs.device)
            start = 0
            for e, n in enumerate(counts.tolist()):                   # host sync: the loop needs the counts
                if n:
                    ys[start:start + n] = _act(m.act, xs[start:start + n] @ self.w_up[e]) @ self.w_down[e]
                    start += n
        ys = ys * top_w.reshape(-1)[order, None]
        out = torch.zeros(x.shape[0], self.width, dtype=ys.dtype, device=ys.device).index_add_(0, token, ys)
        if self.lat_out is not None:
            out = F.linear(out, self.lat_out)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.reshape(shape)

    def advance(self, accepted: torch.Tensor) -> None:
        pass
