"""Every Triton kernel with a launch config, declared once.

A declaration (`KernelSpec`) says what a kernel's launch config depends on and how it may be tuned:

    name        the launch table's key (replayssm/launch_table.py) and the tuner's job name; a KDA build of a
                GDN kernel (PER_CHANNEL=True: other register needs) is its own entry, kda_*, declared here
    family      the geometry it reads: mamba2 (headdim, dstate), gdn / kda (K, V), or "any"
    key_fields  the fields of its key, in order: geometry fields and point fields (L, route, ring_len, window,
                history, depth); `key(geometry, **point)` builds it for the launch function and for the tuner
    default     where its hand rule lives ("module:function"), the config launched without a table entry
    launched_by the (method, routes) pairs that launch it on every step (routes None: every route), from which
                the tuner counts its jobs; () for a kernel outside the timed step (materialize, tree moves)
    space       its tuning space at a key (a list of candidate configs or field dicts), or None: not tuned
    dropped     candidates left out of the space, with the reason: {(route or None, fields): reason}; the AOT
                audit record (experiments/tune_audit.json) adds the spills it finds at tune time

The launch functions (replayssm/*/decode*.py, spec_kernels.py, delta_rule/launch.py, baselines/*), the tuner
(experiments/tune.py: keys, spaces, drops, jobs), the AOT recipes and the audit record read these entries; a
launch of an undeclared kernel is refused by launch_table.resolve.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from replayssm.checks import next_pow2

GEOMETRY_FIELDS = {"mamba2": ("headdim", "dstate"), "gdn": ("K", "V"), "kda": ("K", "V"), "any": ()}
POINT_FIELDS = ("L", "route", "ring_len", "window", "history", "depth")
# Key fields a point does not name but implies: a Mamba-2 spec ring holds B + T entries padded to a power of
# two (replayssm/mamba2/cache.py SpecRing), so ring_len follows from the history B and the window T.
DERIVED = {"ring_len": (("history", "window"), lambda history, window: next_pow2(history + window))}


@dataclass(frozen=True)
class KernelSpec:
    name: str
    family: str
    key_fields: tuple[str, ...]
    default: str
    launched_by: tuple[tuple[str, tuple[str, ...] | None], ...] = ()
    space: Callable[[dict], list] | None = None
    dropped: Mapping[tuple, str] = field(default_factory=dict)

    def key(self, geometry=None, **point) -> dict:
        """The key of a launch: each key field from `point` when given there, else from `geometry`'s attribute."""
        out = {}
        for f in self.key_fields:
            if f in point:
                out[f] = point[f]
            elif geometry is not None and hasattr(geometry, f):
                out[f] = getattr(geometry, f)
            elif f in DERIVED and all(point.get(n) is not None for n in DERIVED[f][0]):
                out[f] = DERIVED[f][1](*(point[n] for n in DERIVED[f][0]))
            else:
                raise ValueError(f"launch key of {self.name}: no value for {f!r} (fields {self.key_fields})")
        return out

    def launched(self, method: str, route: str | None) -> bool:
        """Whether `method` at `route` launches this kernel on every step."""
        return any(m == method and (routes is None or route in routes) for m, routes in self.launched_by)

    def candidates(self, key: dict) -> list:
        return [] if self.space is None else self.space(key)


def grid(**axes) -> list[dict]:
    """Every combination of the axes, as field dicts in the axes' order."""
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


def fits(values, limit: int) -> list[int]:
    """The values no larger than `limit` padded to a power of 2 (a taller tile only adds masked rows)."""
    return [v for v in values if v <= max(1, next_pow2(limit))]


# ----------------------------------------------------------------------------------------------- spaces

def _ssu_space(key: dict) -> list:
    return grid(block_m=fits((4, 8, 16, 32), key["headdim"]), num_warps=(1, 2, 4, 8))


def _mamba2_replay_ar_space(key: dict) -> list:
    return grid(block_m=fits((16, 32, 64), max(16, key["headdim"])), num_warps=(1, 2, 4, 8))


def _mamba2_spec_space(key: dict) -> list:
    # deferred: importing replayssm.mamba2 runs its package __init__, whose kernel modules import this registry
    from replayssm.mamba2.spec_tiles import spec_tile_candidates

    return spec_tile_candidates(key["headdim"], key["window"])


def _mamba2_vf_space(kernel: str) -> Callable[[dict], list]:
    """The verify_fold route's row kernels (mamba2_spec_verify, mamba2_spec_fold): replayssm/mamba2/spec_tiles.py."""
    def space(key: dict) -> list:
        from replayssm.mamba2.spec_tiles import verify_fold_candidates  # deferred, as _mamba2_spec_space

        return verify_fold_candidates(kernel, key["headdim"], key["dstate"])
    return space


def _mamba2_tree_space(key: dict) -> list:
    # the chain's tiles; the tree launch ignores block_t (no padding)
    return [c for c in _mamba2_spec_space(key) if c.block_t is None]


def _recurrent_space(key: dict) -> list:
    return grid(block_v=fits((8, 16, 32), key["V"]), num_warps=(1, 2, 4, 8))


def _serial_spec_space(key: dict) -> list:
    return grid(BV=fits((8, 16, 32), key["V"]), num_warps=(1, 2, 4, 8))


def _delta_replay_ar_space(key: dict) -> list:
    return grid(block_v=fits((16, 32, 64), max(16, key["V"])), num_warps=(2, 4, 8), num_stages=(1, 2))


def _delta_ring_space(key: dict) -> list:
    return grid(BV=fits((16, 32), max(16, key["V"])), BKT=fits((16, 32), max(16, key["K"])), num_warps=(2, 4, 8))


def _fold_route_step_space(key: dict) -> list:
    return grid(block_v=fits((16, 32, 64), max(16, key["V"])), block_k=(32,), num_warps=(2, 4), num_stages=(1,))


def _fold_route_fold_space(key: dict) -> list:
    return grid(block_v=fits((16, 32, 64), max(16, key["V"])), block_k=(32,), num_warps=(2, 4), num_stages=(1, 2))


def _ring_row_space(key: dict) -> list:
    """The ring verify's and fold's tiles (replayssm/delta_rule/spec_verify.py, spec_fold.py): BV value rows x BKT
    state columns per chunk x warps; the defaults (spec_launch.default_config: [64, 32] / [64, 16], 4 warps) are
    members. 18 candidates, the tuner's budget."""
    return grid(BV=fits((32, 64), key["V"]), BKT=fits((16, 32, 64), key["K"]), num_warps=(2, 4, 8))


def _ring_route(family: str, dropped: Mapping[str, Mapping[tuple, str]] | None = None) -> list:
    """The ring verify's "verify_fold" route (replayssm/delta_rule/spec_*.py, issue 35): prep, verify and fold,
    three launches per window, keyed as the fused ring kernel; the KDA builds are their own entries. The verify
    and the fold are tuned over _ring_row_space (their spilling candidates: `dropped` {phase: drops} for GDN, the
    AOT audit record experiments/tune_audit.json for KDA); the prep is not (one warp per (row, key head), its
    tiles fixed by the window: spec_launch.default_config)."""
    ring, default = ("K", "V", "history", "window"), "replayssm.delta_rule.spec_launch:default_config"
    route = (("replay_spec", ("verify_fold",)),)
    return [KernelSpec(f"{family}_ring_prep", family, ring, default, route),
            *(KernelSpec(f"{family}_ring_{phase}", family, ring, default, route, _ring_row_space,
                         (dropped or {}).get(phase, {})) for phase in ("verify", "fold"))]


# ------------------------------------------------------------------------------------- dropped candidates
# Candidates that spill in the AOT build (scripts/kernels/kernel_report.py --tune-space --target 90
# --fp32-state-only, Super-120B and Qwen3.5-122B at TP1, triton 3.7.1): left out of the space everywhere.
# (route or None, fields) -> registers / spill bytes of that build.
def _spills(route, rows, names) -> dict:
    """{(route, ((name, value), ...)): reason} from rows of (*values, registers, spill bytes)."""
    return {(route, tuple(zip(names, vals))): f"sm_90 spills {b} B ({r} registers)" for *vals, r, b in rows}


# output_only: the readout of replayssm/mamba2/ar_kernels.py (no flush code), Super-120B / Nano-4B, fp32 and fp16
# state, triton 3.7.1 and 3.6.0: the one spill is at fp16 state.
_MAMBA2_REPLAY_AR_DROPPED = {
    **_spills("output_only", ((64, 4, 64, 4),), names=("block_m", "num_warps")),
    **_spills("state_and_output", ((32, 1, 255, 316), (64, 1, 255, 4504), (64, 2, 255, 516)),
              names=("block_m", "num_warps")),
}
_SSU_SPEC_DROPPED = _spills(None, ((32, 1, 255, 44),), names=("block_m", "num_warps"))
_GDN_REPLAY_AR_DROPPED = _spills(None, ((64, 2, 1, 255, 664), (64, 2, 2, 255, 664)),
                                 names=("block_v", "num_warps", "num_stages"))
_GDN_SPEC_VERIFY_DROPPED = _spills(None, ((32, 1, 255, 48),), names=("BV", "num_warps"))


# ------------------------------------------------------------------------------------------ declarations

def _declare(*specs: KernelSpec) -> dict[str, KernelSpec]:
    out: dict[str, KernelSpec] = {}
    for s in specs:
        if s.name in out:
            raise ValueError(f"kernel {s.name} declared twice")
        unknown = set(s.key_fields) - set(GEOMETRY_FIELDS[s.family]) - set(POINT_FIELDS)
        if unknown:
            raise ValueError(f"kernel {s.name}: unknown key fields {sorted(unknown)}")
        out[s.name] = s
    return out


# The shipped ring verify ("fused" form of replay_spec) and the tree verify the tuner times on its points
_FUSED_RING = (("replay_spec", ("fused",)),)


def _delta_rule(family: str, dropped_replay_ar=None, dropped_spec_verify=None) -> list[KernelSpec]:
    """The kernels GDN and KDA share (KDA: the same Triton kernels with PER_CHANNEL=True), one entry each per
    family: a GDN table entry never reaches a KDA launch."""
    f = family
    ring = ("K", "V", "history", "window")
    return [
        KernelSpec(f"{f}_replay_ar", f, ("K", "V", "L", "route"), "replayssm.gdn.decode_kernels:default_replay_config",
                   (("replay_ar", ("output_only", "state_and_output")),), _delta_replay_ar_space,
                   dropped_replay_ar or {}),
        KernelSpec(f"{f}_replay_materialize", f, ("K", "V", "L"), "replayssm.gdn.decode_kernels:default_replay_config"),
        KernelSpec(f"{f}_replay_spec", f, ring, "replayssm.gdn.spec_kernels:default_launch_config",
                   _FUSED_RING, _delta_ring_space),
        KernelSpec(f"{f}_replay_tree", f, ring, "replayssm.gdn.spec_kernels:default_launch_config",
                   _FUSED_RING, _delta_ring_space),
        KernelSpec(f"{f}_spec_materialize", f, ring, "replayssm.gdn.spec_kernels:default_launch_config"),
        KernelSpec(f"{f}_recurrent", f, ("K", "V"), "baselines.gdn_recurrent:default_recurrent_config",
                   (("baseline_ar", None),), _recurrent_space),
        KernelSpec(f"{f}_spec_verify", f, ("K", "V"), "baselines.gdn_recurrent_spec:default_serial_config",
                   (("baseline_spec", None),), _serial_spec_space, dropped_spec_verify or {}),
        KernelSpec(f"{f}_cr_verify", f, ("K", "V"), "baselines.gdn_recurrent_spec:default_serial_config",
                   (("commit_replay_spec", None),), _serial_spec_space),
        KernelSpec(f"{f}_cr_commit", f, ("K", "V"), "baselines.gdn_recurrent_spec:default_serial_config",
                   (("commit_replay_spec", None),), _serial_spec_space),
    ]


# The GDN ring verify_fold route's spilling tiles (kernel_report.py --tune-space, Qwen3.5-122B and Qwen3.5-4B,
# b512 T4, fp32 state): the fold's [64, 64] chunk on 2 warps at sm_90 / sm_100 under both Tritons; the verify's
# [64, 64] on 8 warps at sm_100 (Triton 3.7.1).
_RING = ("BV", "BKT", "num_warps")
_GDN_RING_DROPPED = {
    "fold": _spills(None, ((64, 64, 2, 255, 128),), names=_RING),
    "verify": {(None, tuple(zip(_RING, (64, 64, 8)))): "sm_100 spills 4 B (48 registers)"},
}
_GDN_SHARED = _delta_rule("gdn", _GDN_REPLAY_AR_DROPPED, _GDN_SPEC_VERIFY_DROPPED)
_KDA_SHARED = _delta_rule("kda")     # KDA's spilling candidates come from the AOT audit record (experiments/tune.py)
_SSU = "baselines.mamba2_ssu_kernels:default_launch_config"
_M2_AR = "replayssm.mamba2.decode:default_launch_config"
_M2_AR_FOLD = "replayssm.mamba2.decode:default_fold_config"
_M2_SPEC = "replayssm.mamba2.spec_kernels:default_launch_config"
_FOLD = "replayssm.delta_rule.launch:default_ar_config"
_FOLD_ROUTE = (("replay_ar", ("output_only_fold",)),)
_M2_VF = "replayssm.mamba2.spec_verify_fold:default_vf_config"
_M2_VF_ROUTE = (("replay_spec", ("verify_fold",)),)

KERNELS: dict[str, KernelSpec] = _declare(
    KernelSpec("mamba2_replay_ar", "mamba2", ("headdim", "dstate", "L", "route"), _M2_AR,
               (("replay_ar", None),), _mamba2_replay_ar_space, _MAMBA2_REPLAY_AR_DROPPED),
    KernelSpec("mamba2_replay_ar_fold", "mamba2", ("headdim", "dstate", "L"), _M2_AR_FOLD,
               (("replay_ar", ("output_only",)),)),    # the output-only route's flush (mamba2/ar_kernels.py)
    KernelSpec("mamba2_replay_materialize", "mamba2", ("headdim", "dstate", "L", "route"), _M2_AR),
    KernelSpec("mamba2_replay_spec", "mamba2", ("headdim", "dstate", "ring_len", "window"), _M2_SPEC,
               _FUSED_RING, _mamba2_spec_space),
    KernelSpec("mamba2_replay_tree", "mamba2", ("headdim", "dstate", "ring_len", "window"), _M2_SPEC,
               _FUSED_RING, _mamba2_tree_space),
    KernelSpec("mamba2_spec_materialize", "mamba2", ("headdim", "dstate", "ring_len", "window"), _M2_SPEC),
    # the spec verify's "verify_fold" route (replayssm/mamba2/spec_verify_fold.py): issue 35 item 1
    KernelSpec("mamba2_spec_prep", "mamba2", ("headdim", "dstate", "ring_len", "window"), _M2_VF, _M2_VF_ROUTE),
    # tuned on the spec points of that form (sweep.spec_routes: [verify_fold]; the fused form's points keep route
    # None and launch the shipped kernels only)
    KernelSpec("mamba2_spec_verify", "mamba2", ("headdim", "dstate", "ring_len", "window"), _M2_VF, _M2_VF_ROUTE,
               _mamba2_vf_space("mamba2_spec_verify")),
    KernelSpec("mamba2_spec_fold", "mamba2", ("headdim", "dstate", "ring_len", "window"), _M2_VF, _M2_VF_ROUTE,
               _mamba2_vf_space("mamba2_spec_fold")),
    # their IS_TREE builds (tree_verify(route="verify_fold"), issue 35 item 2): their own entries, as
    # mamba2_replay_tree, so a chain entry never reaches a tree; not launched by a swept step, not tuned yet
    KernelSpec("mamba2_spec_verify_tree", "mamba2", ("headdim", "dstate", "ring_len", "window"), _M2_VF),
    KernelSpec("mamba2_spec_fold_tree", "mamba2", ("headdim", "dstate", "ring_len", "window"), _M2_VF),
    KernelSpec("mamba2_ssu_ar", "mamba2", ("headdim", "dstate"), _SSU, (("baseline_ar", None),), _ssu_space),
    KernelSpec("mamba2_ssu_spec", "mamba2", ("headdim", "dstate"), _SSU, (("baseline_spec", None),), _ssu_space,
               _SSU_SPEC_DROPPED),
    KernelSpec("mamba2_cr_verify", "mamba2", ("headdim", "dstate"), _SSU, (("commit_replay_spec", None),),
               _ssu_space),
    KernelSpec("mamba2_cr_commit", "mamba2", ("headdim", "dstate"), _SSU, (("commit_replay_spec", None),),
               _ssu_space),
    *_GDN_SHARED,
    *_KDA_SHARED,
    # GDN's output_only_fold route (replayssm/delta_rule/): three launches per step, keyed by K, V, L
    KernelSpec("gdn_replay_ar_prep", "gdn", ("K", "V", "L"), _FOLD, _FOLD_ROUTE),
    KernelSpec("gdn_replay_ar_step", "gdn", ("K", "V", "L"), _FOLD, _FOLD_ROUTE, _fold_route_step_space),
    KernelSpec("gdn_replay_ar_fold", "gdn", ("K", "V", "L"), _FOLD, _FOLD_ROUTE, _fold_route_fold_space),
    *_ring_route("gdn", _GDN_RING_DROPPED),
    # its prep's IS_TREE build (tree_verify(route="verify_fold"), issue 35 item 2; the verify and the fold are the
    # chain's builds): its own entry, as gdn_replay_tree, so a chain entry never reaches a tree; not launched by a
    # swept step, not tuned yet
    KernelSpec("gdn_ring_prep_tree", "gdn", ("K", "V", "history", "window"),
               "replayssm.delta_rule.spec_launch:default_config"),
    *_ring_route("kda"),
    # KDA's prep built with IS_TREE (kda.tree_verify(route="verify_fold")), as gdn_ring_prep_tree: its own entry, not
    # launched by a swept step, not tuned yet
    KernelSpec("kda_ring_prep_tree", "kda", ("K", "V", "history", "window"),
               "replayssm.delta_rule.spec_launch:default_config"),
    # KDA's builds of the same phases (its own prep kernel; the step and the fold shared with GDN)
    KernelSpec("kda_replay_ar_prep", "kda", ("K", "V", "L"), _FOLD, _FOLD_ROUTE),
    KernelSpec("kda_replay_ar_step", "kda", ("K", "V", "L"), _FOLD, _FOLD_ROUTE, _fold_route_step_space),
    KernelSpec("kda_replay_ar_fold", "kda", ("K", "V", "L"), _FOLD, _FOLD_ROUTE, _fold_route_fold_space),
    KernelSpec("tree_ring_move", "any", ("depth",), "replayssm.tree_ring:_commit_triton (inline rule)"),
)


# The KDA build of each kernel GDN and KDA share (the same Triton kernel launched with PER_CHANNEL=True), as
# declared by _delta_rule: a launch function with a per_channel flag looks its kernel up here.
KDA_BUILD: dict[str, str] = {g.name: k.name for g, k in zip(_GDN_SHARED, _KDA_SHARED)}


def spec(name: str) -> KernelSpec:
    """The declaration of kernel `name`; a clear error for a kernel nobody declared."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"kernel {name!r} has no declaration in replayssm/launch_registry.py (declared: "
                       f"{', '.join(sorted(KERNELS))})") from None


def key(name: str, geometry=None, **point) -> dict:
    """Kernel `name`'s launch key at this geometry and point (see KernelSpec.key)."""
    return spec(name).key(geometry, **point)


def kernels_of(method: str, family: str, route: str | None = None) -> tuple[str, ...]:
    """The tunable kernels `method` launches per step for `family` (at `route`; None: any route)."""
    return tuple(s.name for s in KERNELS.values() if s.family == family and s.space is not None
                 and (s.launched(method, route) if route is not None
                      else any(m == method for m, _ in s.launched_by)))
