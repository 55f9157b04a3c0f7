"""HybridSpec: one model's layer pattern and the dims one tensor-parallel rank sees, from conf/model/<name>.yaml.

Pattern characters (Nemotron-H's `hybrid_override_pattern` notation, extended with G for Gated DeltaNet and K
for Kimi Delta Attention):

    M  Mamba-2 mixer   G  Gated DeltaNet mixer   K  KDA mixer   *  attention   -  dense MLP   E  MoE

The attention kind comes from conf/model `attention.kind`: gqa (default: K and V heads over a KV cache) or mla
(DeepSeek-style multi-head latent attention, Kimi-Linear: one compressed cache entry of kv_lora_rank +
qk_rope_head_dim elements per token and layer, not split by TP).

Every character is one residual sub-layer (pre-norm, x + f(norm(x))). Qwen3.5 decoder layers are a mixer
followed by an MLP/MoE, written as two characters ("G-" / "*E"). Under TP=N the heads, the MLP/expert
intermediate size and the vocabulary (LM head) split N ways; the hidden size does not (activations are
replicated between the row- and column-parallel halves; the all-reduce is not modelled).

`composition`: when the whole model is not built (it does not fit), the block that is built holds one
sub-layer of each kind, in order of first appearance, and the step time is composed from the measured
per-kind times scaled by the pattern's counts (HybridSpec.counts).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from experiments.harness.points import model_spec
from replayssm.geometry import GDNGeometry, Mamba2Geometry

if TYPE_CHECKING:
    from replayssm.geometry import KDAGeometry

KINDS = {"M": "mamba2", "G": "gdn", "K": "kda", "*": "attention", "-": "mlp", "E": "moe"}
SSM_KINDS = ("M", "G", "K")
SSM_CHAR = {"mamba2": "M", "gdn": "G", "kda": "K"}                                    # family -> pattern char
KIND_GROUP = {"M": "ssm", "G": "ssm", "K": "ssm", "*": "attention", "-": "mlp", "E": "mlp"}   # the breakdown's bars


def parse_pattern(pattern: str, key: str = "model.layers.pattern") -> tuple[str, ...]:
    """The pattern's characters, each a known kind; anything else is a ValueError naming it."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{key}: expected a non-empty layer pattern string, got {pattern!r}")
    for i, ch in enumerate(pattern):
        if ch not in KINDS:
            raise ValueError(f"{key}: unknown layer kind {ch!r} at position {i} of {pattern!r}; known kinds: "
                             + ", ".join(f"{k!r} ({v})" for k, v in KINDS.items()))
    return tuple(pattern)


@dataclass(frozen=True)
class AttentionDims:
    num_heads: int                    # per rank
    num_kv_heads: int                 # per rank (MLA: 1, the latent cache every head reads)
    head_dim: int                     # the q.k head dim (MLA: qk_nope_head_dim + qk_rope_head_dim)
    output_gate: bool = False         # Qwen3.5: q_proj also emits a per-head gate, out = attn * sigmoid(gate)
    kind: str = "gqa"                 # gqa | mla
    # MLA only (DeepSeek-V2/V3, Kimi-Linear): q from a full (q_lora_rank None) or low-rank projection; the
    # cache holds the normed latent c [kv_lora_rank] and the shared rope key [qk_rope_head_dim] per token.
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    use_rope: bool = True             # Kimi-Linear: mla_use_nope (no rotation; an elementwise op either way)

    @property
    def kv_token_elems(self) -> int:
        """Cache elements one token takes in one attention layer on one rank: K and V of every KV head (GQA), or
        the compressed latent + rope key (MLA: replicated on every TP rank, as vLLM's MLA backends keep it)."""
        if self.kind == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class MLPDims:
    act: str                          # relu2 (Nemotron-H: up -> relu^2 -> down) | swiglu (Qwen: gate*up)
    intermediate: int | None          # dense MLP, per rank
    num_experts: int | None = None
    top_k: int | None = None
    expert_intermediate: int | None = None   # per rank
    latent: int | None = None         # LatentMoE: experts run in a `latent`-wide space (Nemotron-3-Super)
    shared_intermediate: int | None = None   # shared expert, per rank (None: none)


@dataclass(frozen=True)
class HybridSpec:
    name: str
    family: str
    tp: int
    geometry: Mamba2Geometry | GDNGeometry | KDAGeometry
    has_z: bool
    dt_softplus: bool
    use_qk_l2norm: bool
    hidden: int
    vocab: int                        # per rank (TP-split LM head)
    conv_kernel: int
    pattern: tuple[str, ...]
    attention: AttentionDims | None
    mlp: MLPDims | None
    mtp_pattern: tuple[str, ...]
    buffer_len: int
    history_len: int
    assumed: tuple[str, ...] = field(default=())   # conf keys whose values are assumptions, not sourced
    weight_format: str | None = None  # the served checkpoint: nvfp4 | bfloat16 | None (= the activation dtype)
    bf16_kinds: tuple[str, ...] = ()  # nvfp4: weight kinds kept in bf16 (experiments/hybrid/footprint.py KINDS)

    @property
    def counts(self) -> Counter:
        return Counter(self.pattern)

    @property
    def ssm_layers(self) -> int:
        return sum(self.counts[k] for k in SSM_KINDS)

    @property
    def attention_layers(self) -> int:
        return self.counts["*"]

    def block(self, ssm_copies: int = 1) -> tuple[str, ...]:
        """One sub-layer per kind in order of first appearance: what a composed step builds. `ssm_copies` > 1
        builds that many SSM mixers (each its own state pool, as the kernel sweep's layer stack): on a GPU their
        states together exceed the L2, so the composed SSM time is streamed from HBM, not an L2 artefact."""
        return tuple(ch for k in dict.fromkeys(self.pattern) for ch in k * (ssm_copies if k in SSM_KINDS else 1))

    def composition(self, ssm_copies: int = 1) -> str:
        c = self.counts
        stack = f" ({ssm_copies} SSM pools: their mean)" if ssm_copies > 1 else ""
        return (" + ".join(f"{c[k]}x{k}" for k in dict.fromkeys(self.pattern)) + stack
                + " (per-kind times of one built block) + embed/head")


def _need(cfg: dict, path: str, key: str):
    node = cfg
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        raise ValueError(f"{key}.{path}: not set for model {cfg.get('name')!r} (not in our sources); the e2e step "
                         "needs it: add it to conf/model with its source, or mark it under `assumed`")
    return node


def _split(value: int, tp: int, key: str) -> int:
    if value % tp:
        raise ValueError(f"{key}: {value} is not divisible by TP={tp}")
    return value // tp


def _attention(cfg: dict, tp: int, key: str) -> AttentionDims:
    """The attention dims one rank sees: GQA (heads split, KV heads split or replicated) or MLA (heads split, the
    latent cache whole on every rank)."""
    a = cfg.get("attention") or {}
    kind = a.get("kind") or "gqa"
    if kind not in ("gqa", "mla"):
        raise ValueError(f"{key}.attention.kind: expected gqa or mla, got {kind!r}")
    heads = _split(int(_need(cfg, "attention.num_heads", key)), tp, f"{key}.attention.num_heads")
    if kind == "mla":
        dims = {n: int(_need(cfg, f"attention.{n}", key))
                for n in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
        q_lora = a.get("q_lora_rank")
        return AttentionDims(heads, 1, dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"],
                             output_gate=bool(a.get("output_gate")), kind="mla",
                             q_lora_rank=int(q_lora) if q_lora else None, use_rope=a.get("use_rope") is not False,
                             **dims)
    kv = int(_need(cfg, "attention.num_kv_heads", key))
    kv = max(1, kv // tp)                   # fewer KV heads than ranks: each rank keeps a replica
    if heads % kv:
        raise ValueError(f"{key}.attention: {heads} query heads per rank not a multiple of {kv} KV heads")
    return AttentionDims(heads, kv, int(_need(cfg, "attention.head_dim", key)), output_gate=bool(a.get("output_gate")))


def hybrid_spec(cfg: dict, tp: int | None = None, key: str = "model") -> HybridSpec:
    """Validate a conf/model dict for the e2e step and split it for TP. Raises ValueError naming the key."""
    base = model_spec(cfg, tp, key)           # family, geometry (checked against replayssm.geometry), TP split
    tp = base.tp
    pattern = parse_pattern(_need(cfg, "layers.pattern", key), f"{key}.layers.pattern")
    ssm_char = SSM_CHAR[base.family]
    for wrong in set(SSM_KINDS) - {ssm_char}:
        if wrong in pattern:
            raise ValueError(f"{key}.layers.pattern: layer kind {wrong!r} does not match family {base.family!r}")
    layers = cfg.get("layers") or {}
    counts = Counter(pattern)
    for name, chars in (("ssm", "".join(SSM_KINDS)), ("attention", "*"), ("mlp", "-E")):
        want = layers.get(name)
        got = sum(counts[c] for c in chars)
        if want is not None and want != got:
            raise ValueError(f"{key}.layers.{name}={want} disagrees with the pattern ({got} of {chars!r})")
    hidden = int(_need(cfg, "hidden_size", key))
    vocab = _split(int(_need(cfg, "vocab_size", key)), tp, f"{key}.vocab_size")
    attention = None
    if "*" in pattern or "*" in (cfg.get("mtp") or {}).get("pattern", ""):
        attention = _attention(cfg, tp, key)
    mlp_cfg = cfg.get("mlp") or {}
    mlp = None
    uses_mlp = {"-", "E"} & (set(pattern) | set((cfg.get("mtp") or {}).get("pattern", "")))
    if uses_mlp:
        act = mlp_cfg.get("act", "relu2")
        if act not in ("relu2", "swiglu"):
            raise ValueError(f"{key}.mlp.act: unknown activation {act!r}; expected relu2 or swiglu")
        inter = (_split(int(_need(cfg, "mlp.intermediate_size", key)), tp, f"{key}.mlp.intermediate_size")
                 if "-" in uses_mlp else None)
        moe = {}
        if "E" in uses_mlp:
            shared = mlp_cfg.get("shared_expert_intermediate_size")
            moe = dict(num_experts=int(_need(cfg, "mlp.num_experts", key)),
                       top_k=int(_need(cfg, "mlp.experts_per_token", key)),
                       expert_intermediate=_split(int(_need(cfg, "mlp.moe_intermediate_size", key)), tp,
                                                  f"{key}.mlp.moe_intermediate_size"),
                       latent=mlp_cfg.get("latent"),
                       shared_intermediate=_split(int(shared), tp, f"{key}.mlp.shared_expert_intermediate_size")
                       if shared else None)
            if not 1 <= moe["top_k"] <= moe["num_experts"]:
                raise ValueError(f"{key}.mlp.experts_per_token={moe['top_k']} not in 1..{moe['num_experts']}")
        mlp = MLPDims(act=act, intermediate=inter, **moe)
    rs = cfg.get("replayssm") or {}
    weights = cfg.get("weights") or {}
    fmt = weights.get("dtype")
    if fmt not in (None, "nvfp4", "bfloat16", "float16", "float32"):
        raise ValueError(f"{key}.weights.dtype: expected nvfp4, bfloat16, float16 or float32, got {fmt!r}")
    mtp = (cfg.get("mtp") or {}).get("pattern") or ("*E" if "E" in pattern else "*-")
    return HybridSpec(name=base.name, family=base.family, tp=tp, geometry=base.geometry, has_z=base.has_z,
                      dt_softplus=base.dt_softplus, use_qk_l2norm=base.use_qk_l2norm, hidden=hidden, vocab=vocab,
                      conv_kernel=int(cfg.get("conv_kernel") or 4), pattern=pattern, attention=attention, mlp=mlp,
                      mtp_pattern=parse_pattern(mtp, f"{key}.mtp.pattern"),
                      buffer_len=int(rs.get("buffer_len") or 16), history_len=int(rs.get("history_len") or 16),
                      assumed=tuple(cfg.get("assumed") or ()), weight_format=fmt,
                      bf16_kinds=tuple(weights.get("bf16_kinds") or ()))
