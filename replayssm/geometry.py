"""SSM layer geometries: Mamba-2, Gated DeltaNet, Kimi Delta Attention; the production models, their TP splits.

A geometry is the per-layer shape of one SSM mixer on one GPU. Tensor parallelism splits heads (and
groups) evenly across ranks, so the geometry a kernel sees at TP=k is `geometry.tp_split(k)`.

Sources for the numbers (the ReplaySSM fork Johnny-Liou/ReplaySSM): the ReplaySSM fork's test
geometries `nano4b=(96,80,128,8)`, `super120b=(128,64,128,8)`, `ultra550b=(256,64,128,8)`,
`qwen4b=(16,32,128,128)`, `qwen122b=(16,64,128,128)`; TP8 of Super = 16 heads, 1 group (FlashInfer tests).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


def _check_positive(cls_name: str, **dims: int) -> None:
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{cls_name}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class Mamba2Geometry:
    """Mamba-2 mixer: state [nheads, headdim, dstate]; B and C are shared by nheads/ngroups heads."""

    nheads: int
    headdim: int
    dstate: int
    ngroups: int

    def __post_init__(self) -> None:
        _check_positive("Mamba2Geometry", nheads=self.nheads, headdim=self.headdim, dstate=self.dstate,
                        ngroups=self.ngroups)
        if self.nheads % self.ngroups:
            raise ValueError(f"Mamba2Geometry: nheads={self.nheads} is not a multiple of ngroups={self.ngroups}")

    @property
    def heads_per_group(self) -> int:
        return self.nheads // self.ngroups

    def state_numel(self) -> int:
        """Elements of one sequence's state in one layer."""
        return self.nheads * self.headdim * self.dstate

    def tp_split(self, tp: int) -> Mamba2Geometry:
        """The geometry one rank sees at tensor-parallel degree `tp` (heads and groups split evenly)."""
        _check_positive("tp_split", tp=tp)
        if self.nheads % tp or self.ngroups % tp:
            raise ValueError(f"TP={tp} does not divide nheads={self.nheads} and ngroups={self.ngroups}")
        return replace(self, nheads=self.nheads // tp, ngroups=self.ngroups // tp)


class _DeltaRuleHeads:
    """What the two delta-rule geometries share (GDN: a scalar decay per value head; KDA: one per key channel):
    H key heads (q, k [K]) shared by HV / H value heads each (v [V]); state [HV, V, K] (K-last)."""

    H: int
    HV: int
    K: int
    V: int
    PER_CHANNEL_DECAY = False     # KDA: True (g has a trailing K dim everywhere GDN has a scalar)

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_positive(name, H=self.H, HV=self.HV, K=self.K, V=self.V)
        if self.HV % self.H:
            raise ValueError(f"{name}: HV={self.HV} is not a multiple of H={self.H}")

    @property
    def value_heads_per_key_head(self) -> int:
        return self.HV // self.H

    def state_numel(self) -> int:
        return self.HV * self.V * self.K

    @property
    def decay_dims(self) -> tuple[int, ...]:
        """The trailing dims of one log decay g per value head and token: () for GDN, (K,) for KDA."""
        return (self.K,) if self.PER_CHANNEL_DECAY else ()

    def tp_split(self, tp: int):
        _check_positive("tp_split", tp=tp)
        if self.H % tp or self.HV % tp:
            raise ValueError(f"TP={tp} does not divide H={self.H} and HV={self.HV}")
        return replace(self, H=self.H // tp, HV=self.HV // tp)


@dataclass(frozen=True)
class GDNGeometry(_DeltaRuleHeads):
    """Gated DeltaNet mixer: H key heads (q, k [K]), HV value heads (v [V]); state [HV, V, K] (K-last)."""

    H: int
    HV: int
    K: int
    V: int


@dataclass(frozen=True)
class KDAGeometry(_DeltaRuleHeads):
    """Kimi Delta Attention mixer: the GDN head layout (H key heads, HV value heads, state [HV, V, K] K-last)
    with a log decay per key channel, g [HV, K] per token, instead of one per value head. A distinct class, not
    a GDNGeometry subclass, so that no GDN entry point accepts a KDA cache by an isinstance check."""

    H: int
    HV: int
    K: int
    V: int
    PER_CHANNEL_DECAY = True


# The five production geometries (full width, TP=1). Keys are the model names used in conf/model/.
MAMBA2_MODELS: dict[str, Mamba2Geometry] = {
    "nemotron3_nano_4b": Mamba2Geometry(nheads=96, headdim=80, dstate=128, ngroups=8),
    "nemotron3_super_120b": Mamba2Geometry(nheads=128, headdim=64, dstate=128, ngroups=8),
    "nemotron3_ultra_550b": Mamba2Geometry(nheads=256, headdim=64, dstate=128, ngroups=8),
    "nemotron3_nano_30b_a3b": Mamba2Geometry(nheads=64, headdim=64, dstate=128, ngroups=8),   # conf/model sources
}
GDN_MODELS: dict[str, GDNGeometry] = {
    "qwen35_4b": GDNGeometry(H=16, HV=32, K=128, V=128),
    "qwen35_122b_a10b": GDNGeometry(H=16, HV=64, K=128, V=128),
    "qwen3_next_80b_a3b": GDNGeometry(H=16, HV=32, K=128, V=128),   # conf/model sources (config.json)
}
# Kimi-Linear-48B-A3B (moonshotai/Kimi-Linear-48B-A3B-Instruct, config.json "linear_attn_config":
# {"num_heads": 32, "head_dim": 128, "kda_layers": 20 of the 27 layers, "full_attn_layers": [4, 8, .., 27]}):
# q, k and v share one head count and one head dim (no grouped value heads), V = head_dim (FLA's KDA layer,
# expand_v = 1). The state is 32 x 128 x 128 per layer, the same head shape as the GDN models.
KDA_MODELS: dict[str, KDAGeometry] = {
    "kimi_linear_48b_a3b": KDAGeometry(H=32, HV=32, K=128, V=128),
}


def get_geometry(model: str, tp: int = 1) -> Mamba2Geometry | GDNGeometry | KDAGeometry:
    """Look up a production geometry by model name, split for tensor parallelism `tp`."""
    table = {**MAMBA2_MODELS, **GDN_MODELS, **KDA_MODELS}
    if model not in table:
        raise ValueError(f"unknown model {model!r}; known models: {', '.join(sorted(table))}")
    geometry = table[model]
    return geometry if tp == 1 else geometry.tp_split(tp)
