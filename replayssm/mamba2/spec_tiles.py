"""The Mamba-2 spec kernels' launch config type and tile space (replayssm/mamba2/spec_kernels.py launches with it;
replayssm/launch_registry.py declares the space; the tuner and the AOT report read it from there). Apart from the
kernels so that the registry, which every launch function reads, imports no kernel module.
"""

from __future__ import annotations

from dataclasses import dataclass

from replayssm.checks import next_pow2


@dataclass(frozen=True)
class SpecLaunchConfig:
    """Tiles and warps of the spec kernels. block_m: headdim tile of verify/materialize; block_n: dstate
    chunk (the kernels loop over dstate, so register use does not grow with it); warps of each kernel;
    verify_stages: software-pipelining depth of the verify kernel's dstate loop; block_t: the window axis
    padded for tl.dot (None: max(16, next_pow2(T)), the least tl.dot takes)."""

    block_m: int
    block_n: int
    verify_warps: int
    scatter_warps: int
    verify_stages: int
    block_t: int | None = None

    @property
    def label(self) -> str:
        return (f"m{self.block_m}-n{self.block_n}-w{self.verify_warps}-s{self.verify_stages}"
                f"-t{self.block_t or 'min'}")


# The tile space a GPU tuning run searches (replayssm/mamba2/spec_tuning.py), per geometry and architecture:
# dstate chunk x warps x window padding, with the headdim tile of the default rule. Every candidate is built
# ahead of time for sm_90 and sm_100 at the three Mamba-2 production geometries (scripts/kernels/kernel_report.py
# --spec-tiles, triton 3.7.1); a candidate that spills there is left out of the space, with the reason. Verify
# registers (the same at the three geometries): chunk 16: 148-240 on sm_90, 125-202 on sm_100 (2 warps with a
# 32-row window padding are the most); chunk 32: 165-193 / 178-221; chunk 64: 255 on sm_90 at every warp count.
SPEC_TILE_BLOCK_N = (16, 32, 64)
SPEC_TILE_WARPS = (2, 4, 8)
SPEC_TILE_BLOCK_T = (None, 32)
_CHUNK64 = {2: "verify spills on sm_90 (255 registers, 188-256 bytes of spill stores)",
            4: "verify spills on sm_90 (255 registers, 8-104 bytes of spill stores)",
            8: "verify with a 32-row window padding spills on sm_100 (255 registers, 92 bytes); with the minimal "
               "padding it sits at the 255-register limit on sm_90"}
# (block_n, warps, block_t) -> why the candidate is not in the space
SPEC_TILE_DROPPED: dict[tuple[int, int, int | None], str] = {
    **{(64, w, t): reason for w, reason in _CHUNK64.items() for t in SPEC_TILE_BLOCK_T},
    (16, 8, 32): "the scatter kernel spills 4 bytes on sm_100 at headdim 64 (Super, Ultra)",
}


def dropped_reason(cfg: SpecLaunchConfig) -> str | None:
    """Why `cfg` is not in the tile space (it spills on a production geometry), or None."""
    return SPEC_TILE_DROPPED.get((cfg.block_n, cfg.verify_warps, cfg.block_t))


def spec_tile_candidates(headdim: int, window: int, include_dropped: bool = False) -> list[SpecLaunchConfig]:
    """The tile space of a geometry: every (block_n, warps, block_t), headdim tile by the default rule, less
    the SPEC_TILE_DROPPED ones unless `include_dropped` (the AOT report builds those too, to keep the
    reasons true)."""
    block_m = 16 if headdim <= 16 else 32
    out = []
    for block_n in SPEC_TILE_BLOCK_N:
        for warps in SPEC_TILE_WARPS:
            for block_t in SPEC_TILE_BLOCK_T:
                if block_t is not None and block_t <= max(16, next_pow2(window)):
                    continue                   # the same padding as the default: not a distinct candidate
                cfg = SpecLaunchConfig(block_m, block_n, warps, warps, 2, block_t)
                if include_dropped or dropped_reason(cfg) is None:
                    out.append(cfg)
    return out


# ------------------------------------------------------------------- the "verify_fold" route (spec_verify_fold.py)

@dataclass(frozen=True)
class VerifyFoldConfig:
    """Tiles and warps of one kernel of the "verify_fold" route. block_m: headdim tile (verify and fold; the prep
    takes its group's whole window); block_n: dstate chunk (verify: unrolled, fold: a pipelined runtime loop;
    the prep: all of dstate); num_stages: the fold loop's pipelining depth (1 elsewhere)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    @property
    def label(self) -> str:
        return f"m{self.block_m}-n{self.block_n}-w{self.num_warps}-s{self.num_stages}"


def verify_fold_candidates(kernel: str, headdim: int, dstate: int) -> list[VerifyFoldConfig]:
    """The tile space a GPU tuning run searches for a row kernel of the route (mamba2_spec_verify or
    mamba2_spec_fold): headdim tile 32 / 64 (16 at headdim <= 16), dstate chunk 32 / 64, 2 / 4 warps."""
    bn_max = max(16, next_pow2(dstate))
    out = []
    for block_m in ((16,) if headdim <= 16 else (32, 64)):
        for block_n in sorted({min(32, bn_max), min(64, bn_max)}):
            for warps in (2, 4):
                out.append(VerifyFoldConfig(block_m, block_n, warps, 2 if kernel == "mamba2_spec_fold" else 1))
    return out
