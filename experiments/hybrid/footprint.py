"""Analytic bytes of a hybrid model in serving: weights, KV cache, SSM caches (states, buffers / rings,
cursors, conv states), the maximum concurrency under an HBM budget, and the bytes one decode step moves.

Per sequence and per layer the SSM part is replayssm.traffic.cache_footprint (the analytic twin of the
caches' nbytes()) plus the conv state ((conv_kernel - 1) x conv_dim activations). The KV cache holds
`max_model_len` tokens per sequence (vLLM reserves blocks up to the length a request may reach). Weights are
counted from the dims (HybridSpec), per TP rank, by kind (KINDS), in a weight format: the activation dtype
(what the built model allocates; tests compare it with the bytes allocated), bf16, or NVFP4.

NVFP4 (NVIDIA's 4-bit float for Blackwell): 4-bit E2M1 values plus one FP8 E4M3 scale per block of 16
values, i.e. 0.5 + 1/16 bytes per weight (the one fp32 scale per tensor is left out). Which kinds stay bf16
comes from conf/model `weights.bf16_kinds`.

Two concurrency models:
  plain     (budget - weights) // per-sequence bytes (KV at max_model_len + SSM caches): bytes, no pages.
  vllm      what vLLM's hybrid KV-cache allocator does (vllm/v1/core/kv_cache_utils.py and the hybrid model
            config): one page size for every layer (the attention block size is raised until an attention
            page is at least the SSM page; the SSM page is padded to it); the layers of each kind are cut into
            groups of `group_size` layers (the smallest kind's count, or the largest's when within 1.25x), and
            num_blocks = available // (page x group_size); a request takes cdiv(max_model_len, block_size)
            blocks of the attention group and, per SSM group, 1 block (T blocks for the native spec path,
            one state per window position); the budget is gpu_memory_utilization x HBM minus the weights and
            the activation peak of the profiling run.

CLI (the paper's concurrency table at (B = 16, T = 4), max_model_len 2048, beside vLLM PR #47576's values; one row
per model, mode and SSM state format, STATE_DTYPES, with each format's cap over the fp32 state's):
    python -m experiments.hybrid.footprint                         # TABLE_MODELS on hardware=b300
    python -m experiments.hybrid.footprint model=qwen35_122b_a10b hardware=b200 T=6 states=float32,int8
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf

from experiments.harness.methods import REGISTRY
from experiments.harness.points import CONF_DIR, load_model_config
from experiments.hybrid.spec import SSM_KINDS, HybridSpec, hybrid_spec
from replayssm import traffic

MODE_METHOD = {"ar": "baseline_ar", "ar_replay": "replay_ar", "native": "baseline_spec",
               "commit_replay": "commit_replay_spec", "replayssm": "replay_spec"}
MODE_BY_METHOD = {method: mode for mode, method in MODE_METHOD.items()}
NVFP4_BYTES = 0.5 + 1 / 16            # E2M1 value + one E4M3 scale per 16 values
FORMAT_BYTES = {"nvfp4": NVFP4_BYTES, "bfloat16": 2, "float16": 2, "float32": 4}
# Weight kinds: the linear ones may be NVFP4; the rest (norms, conv1d taps, per-head vectors) are no nn.Linear.
LINEAR_KINDS = ("ssm_proj", "attention", "mlp", "experts", "shared_expert", "latent", "router", "lm_head", "eh_proj")
KINDS = LINEAR_KINDS + ("embedding", "conv1d", "norm", "vector")
# vLLM's hybrid allocator (see the module docstring): attention block sizes are multiples of this (assumed: the
# FlashAttention / FlashInfer block alignment of 16 tokens); group sizes within 1.25x of each other merge.
KV_BLOCK_ALIGN = 16
GROUP_MERGE_RATIO = 1.25

# PR #47576 (github.com/vllm-project/vllm/pull/47576): max decode concurrency at (B = 16, T = 4),
# max_model_len 2048, 1x B300, NVFP4 checkpoints with MTP.
PUBLISHED_CONCURRENCY = {"nemotron3_super_120b": {"native": 213, "replayssm": 694},
                         "qwen35_122b_a10b": {"native": 233, "replayssm": 702}}
# The CLI's default table: the published pair, then the hybrids added from their configs (no published count;
# BF16 checkpoints): Kimi-Linear (KDA + MLA), Qwen3-Next (GDN), Nemotron-3-Nano-30B (Mamba-2).
TABLE_MODELS = [*PUBLISHED_CONCURRENCY, "kimi_linear_48b_a3b", "qwen3_next_80b_a3b", "nemotron3_nano_30b_a3b"]
# SSM state formats of the table's rows: an 8-bit state (int8 or fp8 e4m3) holds one byte per element plus one fp32
# scale per (slot, head) (replayssm.traffic.cache_footprint's Footprint.scales); the buffers stay in the activation
# dtype. PR #47576's published counts are at fp32 state.
STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8,
                "float8_e4m3fn": torch.float8_e4m3fn}


def _nb(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def conv_dim(spec: HybridSpec) -> int:
    """Channels of the causal conv (Mamba-2: x, B, C; GDN and KDA: q, k, v; Kimi's three short convs)."""
    g = spec.geometry
    if spec.family == "mamba2":
        return g.nheads * g.headdim + 2 * g.ngroups * g.dstate
    return 2 * g.H * g.K + g.HV * g.V


def kda_proj_widths(spec: HybridSpec) -> dict[str, int]:
    """Output widths of a KDA mixer's projections from the hidden state (vLLM's KimiGatedDeltaNetAttention):
    q, k [H x K], v [HV x V], the decay's low-rank leg f_a [K] (f_b: K -> HV x K, per key channel), beta [HV],
    the output gate's low-rank leg g_a [V] (g_b: V -> HV x V). f_a / g_a are replicated under TP."""
    g = spec.geometry
    return {"q": g.H * g.K, "k": g.H * g.K, "v": g.HV * g.V, "f_a": g.K, "b": g.HV, "g_a": g.V}


def attention_weights(a) -> int:
    """Linear weights of one attention sub-layer on one rank, without the hidden size factor (x d)."""
    if a.kind == "mla":
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        return a.num_heads * qk + (a.kv_lora_rank + a.qk_rope_head_dim) + a.num_heads * a.v_head_dim
    q = a.num_heads * a.head_dim * (2 if a.output_gate else 1)
    return q + 2 * a.num_kv_heads * a.head_dim + a.num_heads * a.head_dim


def layer_weights(spec: HybridSpec, kind: str) -> dict[str, int]:
    """Parameters of one sub-layer of `kind` on one rank by weight kind (KINDS), its pre-norm included."""
    d, g = spec.hidden, spec.geometry
    if kind == "M":
        inner = g.nheads * g.headdim
        proj = inner + conv_dim(spec) + g.nheads
        return {"ssm_proj": d * proj + inner * d, "conv1d": conv_dim(spec) * (spec.conv_kernel + 1),
                "norm": inner + d, "vector": 3 * g.nheads}
    if kind == "G":
        inner = g.HV * g.V
        proj = conv_dim(spec) + inner + 2 * g.HV
        return {"ssm_proj": d * proj + inner * d, "conv1d": conv_dim(spec) * (spec.conv_kernel + 1),
                "norm": inner + d, "vector": 2 * g.HV}
    if kind == "K":
        inner = g.HV * g.V
        lowrank = g.K * g.HV * g.K + g.V * inner                          # f_b, g_b
        return {"ssm_proj": d * sum(kda_proj_widths(spec).values()) + lowrank + inner * d,
                "conv1d": conv_dim(spec) * spec.conv_kernel, "norm": g.V + d, "vector": g.HV + g.HV * g.K}
    if kind == "*":
        a = spec.attention
        out = {"attention": d * attention_weights(a), "norm": d}
        if a.kind == "mla":       # kv_b_proj (latent -> per-head k_nope, v), the latent's norm, q's low rank
            out["attention"] += a.kv_lora_rank * a.num_heads * (a.qk_nope_head_dim + a.v_head_dim)
            out["norm"] += a.kv_lora_rank
            if a.q_lora_rank:
                qk = a.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
                out["attention"] += a.q_lora_rank * (d + qk) - d * qk
                out["norm"] += a.q_lora_rank
        return out
    m = spec.mlp
    up = 2 if m.act == "swiglu" else 1
    if kind == "-":
        return {"mlp": d * m.intermediate * (up + 1), "norm": d}
    width = m.latent or d
    out = {"experts": m.num_experts * width * m.expert_intermediate * (up + 1), "router": m.num_experts * d, "norm": d}
    if m.latent:
        out["latent"] = 2 * d * m.latent
    if m.shared_intermediate:
        out["shared_expert"] = d * m.shared_intermediate * (up + 1)
    return out


def layer_params(spec: HybridSpec, kind: str) -> int:
    return sum(layer_weights(spec, kind).values())


def model_weights(spec: HybridSpec, with_mtp: bool) -> dict[str, int]:
    """Parameters of the whole model (its full pattern, embedding, final norm, LM head; the MTP module when
    `with_mtp`: its sub-layers, eh_proj and two norms; it shares embedding and head) by weight kind."""
    total = {"embedding": spec.vocab * spec.hidden, "lm_head": spec.vocab * spec.hidden, "norm": spec.hidden}
    chars = list(spec.pattern) + (list(spec.mtp_pattern) if with_mtp else [])
    for ch in chars:
        for k, n in layer_weights(spec, ch).items():
            total[k] = total.get(k, 0) + n
    if with_mtp:
        total["eh_proj"] = 2 * spec.hidden * spec.hidden
        total["norm"] += 2 * spec.hidden
    return total


def weight_bytes(spec: HybridSpec, params: dict[str, int], fmt: str) -> int:
    """Bytes of `params` (by kind) stored as `fmt`: NVFP4 for the linear kinds not in spec.bf16_kinds, bf16
    for the others; every kind at the format's width otherwise."""
    if fmt not in FORMAT_BYTES:
        raise ValueError(f"weight format: expected one of {list(FORMAT_BYTES)}, got {fmt!r}")
    if fmt != "nvfp4":
        return int(sum(params.values()) * FORMAT_BYTES[fmt])
    keep = set(spec.bf16_kinds)
    return int(sum(n * (NVFP4_BYTES if k in LINEAR_KINDS and k not in keep else 2) for k, n in params.items()))


@dataclass(frozen=True)
class Footprint:
    weights: int            # model + MTP drafter weights on one rank
    kv_per_seq: int         # KV cache of one sequence at max_model_len (all attention layers, MTP included)
    ssm_per_seq: int        # SSM caches + conv states of one sequence (all SSM layers)
    weight_format: str = ""

    @property
    def per_seq(self) -> int:
        return self.kv_per_seq + self.ssm_per_seq


def _fmt_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def ssm_layer_bytes(spec: HybridSpec, mode: str, *, act_dtype: torch.dtype, state_dtype: torch.dtype,
                    spec_T: int | None) -> tuple[traffic.Footprint, int]:
    """(SSM cache footprint of one layer and one sequence in `mode`, conv-state bytes of it)."""
    if mode not in MODE_METHOD:
        raise ValueError(f"mode: unknown serving mode {mode!r}; expected one of {list(MODE_METHOD)}")
    fp = traffic.cache_footprint(MODE_METHOD[mode], spec.geometry, L=spec.buffer_len, B_hist=spec.history_len,
                                 T=spec_T, state_bytes=_nb(state_dtype), act_bytes=_nb(act_dtype))
    return fp, (spec.conv_kernel - 1) * conv_dim(spec) * _nb(act_dtype)


def footprint(spec: HybridSpec, mode: str, *, act_dtype: torch.dtype, state_dtype: torch.dtype, max_model_len: int,
              spec_T: int | None = None, with_mtp: bool | None = None, weight_format: str | None = None) -> Footprint:
    """Analytic bytes of the whole model (its full pattern) in `mode` (MODE_METHOD). `weight_format`: None =
    the activation dtype (what the built model allocates), "checkpoint" = the served checkpoint's format
    (conf/model weights.dtype), or a format name (FORMAT_BYTES)."""
    fp, conv = ssm_layer_bytes(spec, mode, act_dtype=act_dtype, state_dtype=state_dtype, spec_T=spec_T)
    with_mtp = mode not in ("ar", "ar_replay") if with_mtp is None else with_mtp
    if weight_format == "checkpoint":
        weight_format = spec.weight_format
    fmt = weight_format or _fmt_name(act_dtype)
    attn = spec.attention_layers + (spec.mtp_pattern.count("*") if with_mtp else 0)
    kv = 0
    if attn:
        kv = attn * max_model_len * spec.attention.kv_token_elems * _nb(act_dtype)
    return Footprint(weights=weight_bytes(spec, model_weights(spec, with_mtp), fmt), kv_per_seq=kv,
                     ssm_per_seq=spec.ssm_layers * (fp.total + conv), weight_format=fmt)


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


# ------------------------------------------------------------------------------------- bytes of one step

def experts_touched(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct routed experts `tokens` tokens touch when each picks top_k of num_experts uniformly."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def _pass_weights(spec: HybridSpec, chars, tokens: int) -> float:
    """Parameters one forward pass over `tokens` tokens reads: every sub-layer of `chars`, routed experts only
    as far as the tokens touch them."""
    n = 0.0
    for ch in chars:
        w = layer_weights(spec, ch)
        experts = w.pop("experts", 0)
        n += sum(w.values())
        if experts:
            m = spec.mlp
            n += experts * experts_touched(m.num_experts, m.top_k, tokens) / m.num_experts
    return n


def step_bytes(spec: HybridSpec, method: str, call, *, batch: int, context_len: int, T: int,
               counts: torch.Tensor | None, with_mtp: bool) -> dict[str, float]:
    """Analytic bytes of one (verify + commit, or AR decode) step of the whole model on one rank, every row at
    `context_len`: weights read (in the activation dtype the step is timed with; MoE: the experts the batch's
    tokens touch), KV read (and the window's writes), SSM state + buffer traffic (replayssm.traffic through the
    method's own model, as the kernel rows), and the MTP drafter's T - 1 passes when `with_mtp`."""
    ab = _nb(call.act_dtype)
    tr = REGISTRY[method].traffic(call, call, counts.cpu() if counts is not None else None)
    ssm = float(tr.total) * batch * spec.ssm_layers if tr is not None else float("nan")
    head = spec.vocab * spec.hidden
    weights = (_pass_weights(spec, spec.pattern, batch * T) + head) * ab
    a = spec.attention
    token_kv = a.kv_token_elems * ab if a else 0
    kv = spec.attention_layers * batch * (context_len + T) * token_kv
    if with_mtp and T > 1:
        drafts = T - 1
        weights += drafts * (_pass_weights(spec, spec.mtp_pattern, batch) + head + 2 * spec.hidden ** 2) * ab
        kv += drafts * spec.mtp_pattern.count("*") * batch * (context_len + 1) * token_kv
    total = weights + kv + ssm
    return {"bytes_weights": weights, "bytes_kv": kv, "bytes_ssm": ssm, "bytes_step": total,
            "ssm_byte_share": ssm / total if total else None}


# ------------------------------------------------------------------------------- vLLM's hybrid allocator

@dataclass(frozen=True)
class VllmPlan:
    """vLLM's KV-cache plan of one model in one mode (see the module docstring)."""

    block_size: int          # attention tokens per block after raising the page to the SSM page
    page_bytes: int          # one page, every layer
    ssm_page_bytes: int      # the SSM page before padding
    group_size: int          # layers per group
    attention_groups: int
    ssm_groups: int
    blocks_per_request: int
    available_bytes: float   # util x HBM - weights - activation reserve
    num_blocks: int

    @property
    def concurrency(self) -> float:
        return self.num_blocks / self.blocks_per_request


def vllm_plan(spec: HybridSpec, mode: str, *, hbm_bytes: float, gpu_memory_utilization: float, weights: int,
              activation_reserve: float, max_model_len: int, spec_T: int | None, act_dtype=torch.bfloat16,
              state_dtype=torch.float32, kv_block_align: int = KV_BLOCK_ALIGN) -> VllmPlan:
    """Max concurrency as vLLM's allocator computes it (get_max_concurrency_for_kv_cache_config)."""
    fp, conv = ssm_layer_bytes(spec, mode, act_dtype=act_dtype, state_dtype=state_dtype, spec_T=spec_T)
    # vLLM's native spec path keeps one state per window position: T blocks of one state each per request
    ssm_blocks = spec_T if mode == "native" else 1
    ssm_page = (fp.total - fp.scratch) // ssm_blocks + fp.scratch + conv if mode == "native" else fp.total + conv
    with_mtp = mode not in ("ar", "ar_replay")
    n_attn = spec.attention_layers + (spec.mtp_pattern.count("*") if with_mtp else 0)
    a = spec.attention
    token_bytes = a.kv_token_elems * _nb(act_dtype)
    block = math.ceil(ssm_page / token_bytes / kv_block_align) * kv_block_align
    page = block * token_bytes
    counts = [n for n in (n_attn, spec.ssm_layers) if n]
    group = min(counts) if max(counts) >= GROUP_MERGE_RATIO * min(counts) else max(counts)
    attn_groups, ssm_groups = math.ceil(n_attn / group), math.ceil(spec.ssm_layers / group)
    per_request = attn_groups * math.ceil(max_model_len / block) + ssm_groups * ssm_blocks
    available = hbm_bytes * gpu_memory_utilization - weights - activation_reserve
    num_blocks = max(0, int(available // (page * group)))
    return VllmPlan(block_size=block, page_bytes=page, ssm_page_bytes=ssm_page, group_size=group,
                    attention_groups=attn_groups, ssm_groups=ssm_groups, blocks_per_request=per_request,
                    available_bytes=available, num_blocks=num_blocks)


def activation_reserve(spec: HybridSpec, max_num_batched_tokens: int, act_dtype=torch.bfloat16) -> int:
    """The activation peak of vLLM's profiling forward over `max_num_batched_tokens` tokens, estimated as the
    widest sub-layer's live tensors: residual + normed input + the layer's widest intermediate (MoE: every
    token's top-k expert copies at the expert width; SSM: the in_proj output) per token, plus fp32 router
    logits. Assumed: vLLM measures it, no source gives it for these models."""
    d, nb = spec.hidden, _nb(act_dtype)
    widest = 0
    for ch in set(spec.pattern) | set(spec.mtp_pattern):
        if ch in SSM_KINDS:
            w = layer_weights(spec, ch)["ssm_proj"] // d      # in_proj + out_proj widths
        elif ch == "*":
            w = layer_weights(spec, ch)["attention"] // d
        elif ch == "-":
            w = spec.mlp.intermediate * 2
        else:
            m = spec.mlp
            w = m.top_k * ((m.latent or d) + 2 * m.expert_intermediate) + 4 * m.num_experts // nb
        widest = max(widest, w)
    return int(max_num_batched_tokens * (2 * d + widest) * nb)


# ----------------------------------------------------------------------------------------------------- CLI

def _parse(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    options = {"B": "16", "T": "4", "max_model_len": "2048", "gpu_memory_utilization": "0.9",
               "max_num_batched_tokens": "8192", "activation_reserve_gb": "", "tp": "", "weights": "checkpoint",
               "states": ",".join(STATE_DTYPES)}
    overrides = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ValueError(f"{arg!r}: expected key=value (model=..., hardware=..., {', '.join(options)})")
        if key in options:
            options[key] = value
        elif key in ("model", "hardware"):
            overrides.append(arg)
        else:
            raise ValueError(f"{key}: unknown option; expected model, hardware or one of {list(options)}")
    return overrides, options


def state_dtypes(names: str) -> list[str]:
    """The `states` option (comma-separated STATE_DTYPES keys), checked."""
    out = [n.strip() for n in names.split(",") if n.strip()]
    bad = [n for n in out if n not in STATE_DTYPES]
    if bad or not out:
        raise ValueError(f"states: expected some of {list(STATE_DTYPES)}, got {names!r}")
    return out


def concurrency_table(models: list[str], hardware: dict, options: dict[str, str]) -> list[dict]:
    """One row per (model, SSM state format, mode): plain and vLLM-allocator concurrency beside the published value
    (fp32 state only), and each format's caps over the fp32 state's (`vllm/fp32`, `plain/fp32`). `options["states"]`
    (default "float32") picks the formats."""

    hbm = hardware.get("hbm_bytes")
    if not hbm:
        raise ValueError(f"hardware={hardware.get('name')}: hbm_bytes is not set; pick b300, b200, h200 or h100")
    B, T, mml = int(options["B"]), int(options["T"]), int(options["max_model_len"])
    util = float(options["gpu_memory_utilization"])
    states = state_dtypes(options.get("states", "float32"))
    # the published counts hold only at PR #47576's conditions
    published_here = (hardware.get("name") == "b300" and (B, T, mml) == (16, 4, 2048) and util == 0.9
                      and options["weights"] == "checkpoint" and not options["tp"])
    rows = []
    for name in models:
        cfg = load_model_config(name)
        spec = hybrid_spec(cfg, int(options["tp"]) if options["tp"] else None)
        spec = replace(spec, history_len=B)
        reserve = (float(options["activation_reserve_gb"]) * 1e9 if options["activation_reserve_gb"]
                   else activation_reserve(spec, int(options["max_num_batched_tokens"])))
        fp32 = {}
        for state in ["float32"] + [s for s in states if s != "float32"]:
            base = {}
            for mode in ("native", "replayssm"):
                fp = footprint(spec, mode, act_dtype=torch.bfloat16, state_dtype=STATE_DTYPES[state],
                               max_model_len=mml, spec_T=T, weight_format=options["weights"])
                plain = max_concurrency(hbm * util - reserve, fp)
                plan = vllm_plan(spec, mode, hbm_bytes=hbm, gpu_memory_utilization=util, weights=fp.weights,
                                 activation_reserve=reserve, max_model_len=mml, spec_T=T,
                                 state_dtype=STATE_DTYPES[state])
                pub = PUBLISHED_CONCURRENCY.get(name, {}).get(mode) if published_here and state == "float32" else None
                base[mode] = (plain, plan.concurrency, pub)
                fp32.setdefault(mode, (plain, plan.concurrency))
                if state not in states:
                    continue
                ref = fp32[mode]
                rows.append({"model": name, "tp": spec.tp, "state": state, "mode": mode,
                             "weights_GB": fp.weights / 1e9, "weight_format": fp.weight_format,
                             "reserve_GB": reserve / 1e9, "per_seq_MB": fp.per_seq / 1e6,
                             "ssm_per_seq_MB": fp.ssm_per_seq / 1e6, "plain": plain, "vllm": plan.concurrency,
                             "plain/fp32": plain / ref[0] if ref[0] else None,
                             "vllm/fp32": plan.concurrency / ref[1] if ref[1] else None,
                             "published": pub, "vllm/published": plan.concurrency / pub if pub else None,
                             "plain/published": plain / pub if pub else None, "block_size": plan.block_size,
                             "page_MB": plan.page_bytes / 1e6, "groups": f"{plan.attention_groups}x* + "
                             f"{plan.ssm_groups}xSSM of {plan.group_size}", "blocks/req": plan.blocks_per_request})
            if state not in states:
                continue
            n, rp = base["native"], base["replayssm"]
            r = rows[-1]                                   # the replayssm row of this (model, state)
            r["ratio_plain"], r["ratio_vllm"] = rp[0] / n[0] if n[0] else None, rp[1] / n[1] if n[1] else None
            r["ratio_published"] = rp[2] / n[2] if n[2] and rp[2] else None
    return rows


def main(argv: list[str] | None = None) -> int:
    import pandas as pd  # deferred: only this table needs pandas, not the runners that import footprint

    try:
        overrides, options = _parse(sys.argv[1:] if argv is None else argv)
        chosen = dict(o.split("=", 1) for o in overrides)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"hardware={chosen.get('hardware', 'b300')}"])
        hardware = OmegaConf.to_container(cfg.hardware, resolve=True)
        models = [chosen["model"]] if "model" in chosen else TABLE_MODELS
        rows = concurrency_table(models, hardware, options)
    except (ValueError, FileNotFoundError, HydraException) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"max concurrency at (B={options['B']}, T={options['T']}), max_model_len {options['max_model_len']}, "
          f"{hardware['name']} ({hardware['hbm_bytes'] / 1e9:.0f} GB x gpu_memory_utilization "
          f"{options['gpu_memory_utilization']}), SSM state per row (8-bit: + one fp32 scale per head), bf16 KV and "
          "buffers; published: vLLM PR #47576 (fp32 state)")
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    print(pd.DataFrame(rows).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
