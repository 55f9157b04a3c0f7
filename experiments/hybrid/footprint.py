"""Analytic bytes of a hybrid model in serving: weights, KV cache, SSM caches (states, buffers / rings,
cursors, conv states), and the maximum concurrency under an HBM budget.

Per sequence and per layer the SSM part is replayssm.traffic.cache_footprint (the analytic twin of the
caches' nbytes()) plus the conv state ((conv_kernel - 1) x conv_dim activations). The KV cache holds
`max_model_len` tokens per sequence (vLLM reserves blocks up to the length a request may reach). Weights are
counted from the dims (HybridSpec), per TP rank. Tests compare all of it with the bytes actually allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from experiments.hybrid.spec import HybridSpec
from replayssm import traffic

MODE_METHOD = {"ar": "baseline_ar", "ar_replay": "replay_ar", "native": "baseline_spec",
               "commit_replay": "commit_replay_spec", "replayssm": "replay_spec"}


def _nb(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def conv_dim(spec: HybridSpec) -> int:
    g = spec.geometry
    if spec.family == "mamba2":
        return g.nheads * g.headdim + 2 * g.ngroups * g.dstate
    return 2 * g.H * g.K + g.HV * g.V


def layer_params(spec: HybridSpec, kind: str) -> int:
    """Parameters of one sub-layer of `kind` on one rank (its pre-norm weight included)."""
    d, g = spec.hidden, spec.geometry
    if kind == "M":
        inner = g.nheads * g.headdim
        proj = inner + conv_dim(spec) + g.nheads
        return d * proj + conv_dim(spec) * (spec.conv_kernel + 1) + inner + inner * d + 3 * g.nheads + d
    if kind == "G":
        inner = g.HV * g.V
        proj = conv_dim(spec) + inner + 2 * g.HV
        return d * proj + conv_dim(spec) * (spec.conv_kernel + 1) + inner + inner * d + 2 * g.HV + d
    if kind == "*":
        a = spec.attention
        return d * (a.num_heads + 2 * a.num_kv_heads) * a.head_dim + a.num_heads * a.head_dim * d + d
    m = spec.mlp
    up = 2 if m.act == "swiglu" else 1
    if kind == "-":
        return d * m.intermediate * (up + 1) + d
    width = m.latent or d
    n = m.num_experts * width * m.expert_intermediate * (up + 1) + m.num_experts * d
    if m.latent:
        n += 2 * d * m.latent
    if m.shared_intermediate:
        n += d * m.shared_intermediate * (up + 1)
    return n + d


@dataclass(frozen=True)
class Footprint:
    weights: int            # model + MTP drafter weights on one rank
    kv_per_seq: int         # KV cache of one sequence at max_model_len (all attention layers, MTP included)
    ssm_per_seq: int        # SSM caches + conv states of one sequence (all SSM layers)

    @property
    def per_seq(self) -> int:
        return self.kv_per_seq + self.ssm_per_seq


def footprint(spec: HybridSpec, mode: str, *, act_dtype: torch.dtype, state_dtype: torch.dtype, max_model_len: int,
              spec_T: int | None = None, with_mtp: bool | None = None) -> Footprint:
    """Analytic bytes of the whole model (its full pattern) in `mode` (MODE_METHOD)."""
    if mode not in MODE_METHOD:
        raise ValueError(f"mode: unknown serving mode {mode!r}; expected one of {list(MODE_METHOD)}")
    ab, sb = _nb(act_dtype), _nb(state_dtype)
    with_mtp = mode not in ("ar", "ar_replay") if with_mtp is None else with_mtp
    params = sum(layer_params(spec, ch) for ch in spec.pattern) + 2 * spec.vocab * spec.hidden + spec.hidden
    attn = spec.attention_layers
    if with_mtp:
        params += sum(layer_params(spec, ch) for ch in spec.mtp_pattern)
        params += 2 * spec.hidden * spec.hidden + 2 * spec.hidden          # eh_proj + its two norms
        attn += spec.mtp_pattern.count("*")
    kv = 0
    if attn:
        a = spec.attention
        kv = attn * 2 * max_model_len * a.num_kv_heads * a.head_dim * ab
    method = MODE_METHOD[mode]
    fp = traffic.cache_footprint(method, spec.geometry, L=spec.buffer_len, B_hist=spec.history_len, T=spec_T,
                                 state_bytes=sb, act_bytes=ab)
    conv = (spec.conv_kernel - 1) * conv_dim(spec) * ab
    return Footprint(weights=params * ab, kv_per_seq=kv, ssm_per_seq=spec.ssm_layers * (fp.total + conv))


def max_concurrency(budget_bytes: float, fp: Footprint) -> int:
    """Sequences that fit `budget_bytes` after the weights (0 when the weights alone do not fit)."""
    free = budget_bytes - fp.weights
    return max(0, int(free // fp.per_seq))


def hbm_budget(hardware: dict, device: str, sweep: dict) -> tuple[float, str]:
    """(budget bytes, where it came from): sweep.hbm_bytes, else the hardware config's hbm_bytes, else the CUDA
    device's total memory, else sweep.hbm_fallback_bytes (documented in the sweep); x sweep.hbm_util."""
    util = float(sweep.get("hbm_util", 0.9))
    for source, value in (("sweep.hbm_bytes", sweep.get("hbm_bytes")),
                          ("hardware.hbm_bytes", hardware.get("hbm_bytes"))):
        if value:
            return float(value) * util, source
    if device == "cuda":
        return float(torch.cuda.get_device_properties(0).total_memory) * util, "cuda total_memory"
    return float(sweep["hbm_fallback_bytes"]) * util, "sweep.hbm_fallback_bytes"
