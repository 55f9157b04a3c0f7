"""Analytic HBM bytes and FLOPs per decode step, per layer, per sequence: the roofline model.

Accounting (ReplaySSM blog §4.1): every byte a kernel must move from or to HBM at least once:
the recurrent state(s), the step's inputs and outputs, the cache entries it reads and the ones it appends.
Ignored, as in §5.2: the conv state, scratch (`bc_pre`), z, D and the per-head parameters (A, dt_bias).
Sizes are parameters: `state_bytes` (4 fp32, 2 fp16, 1 an 8-bit int8 / fp8 e4m3 state), `act_bytes` (2 bf16/fp16,
4 fp32). An 8-bit state carries one fp32 scale per (slot, head) (replayssm/fp8_checkpoint.py): every read of the
state reads its scales and every write writes them (`*_checkpoint_bytes` = elements + scales; the baselines per
step, ReplaySSM's checkpoint at a flush), and the footprint holds them (Footprint.scales). Cached dt / g
and the per-head scalars that arrive as inputs (raw dt, GDN g and beta) are fp32 in this repo (the inputs
module draws them fp32), so they count 4 bytes each; the blog's formula counts raw dt at 2 bytes, a
difference of nheads * 2 bytes per step (< 0.01 % of the total).

One step is a `Traffic(read, write, flops)`; a mean over a cycle of steps has fractional fields. Divide by
the accepted count for a per-token figure: `mamba2_replay_spec(...) / accepted`.

Mamba-2 shapes per sequence (geometry nheads H, headdim P, dstate N, ngroups G):
    state [H, P, N]; inputs x [H, P], B, C [G, N], dt [H]; output y [H, P];
    cache entry per token (AR buffer, spec ring, commit-replay stash): x [H, P], B [G, N], dt [H] fp32.
GDN shapes per sequence (key heads H, value heads HV, K, V):
    state [HV, V, K]; inputs q, k [H, K], v [HV, V], g, beta [HV] fp32; output o [HV, V];
    ReplaySSM entry: u [HV, V], k [H, K], g [HV] fp32; commit-replay stash: raw v, k, g, beta.

FLOPs per head follow the blog's convention (§5.1, Mamba-2: d = headdim, n = dstate, h cached entries):
    baseline step                          6dn            (= the state-and-output route with h = 0)
    state-and-output route (and flushes)   2(h+1)dn + 2dn + 2dn
    output-only route                      2dn + d + 2(h+1)n + n + 2(h+1)d
GDN (per value head, VK = V*K) counts its rank updates and readouts the same way; see `_gdn_flops_*`.
KDA (replayssm.kda, a K-vector g per value head and token) is in replayssm/traffic_kda.py, re-exported here
(traffic.kda_replay_ar, ...); cache_footprint / tree_traffic take a KDAGeometry. The units (Traffic, Footprint,
the checks, spec_cycle, GDN's sizes and FLOPs) live in replayssm/traffic_core.py, also re-exported here.
"""

from __future__ import annotations

from replayssm.checks import check_route, next_pow2
from replayssm.geometry import GDNGeometry, KDAGeometry, Mamba2Geometry
from replayssm.traffic_core import (  # noqa: F401 - re-exported: traffic.X is the public name of every unit
    CACHED_SCALAR_BYTES,
    EIGHT_BIT,
    FP32,
    HALF,
    ROUTES,
    SCALE_BYTES,
    STATE_BYTES,
    Footprint,
    Traffic,
    _check_dtypes,
    _check_geometry,
    _check_int,
    _check_spec,
    _gdn_flops_baseline_token,
    _gdn_flops_replay,
    _gdn_flops_spec_verify,
    gdn_checkpoint_bytes,
    gdn_entry_bytes,
    gdn_input_bytes,
    gdn_output_bytes,
    gdn_scale_bytes,
    gdn_stash_bytes,
    gdn_state_bytes,
    mean_traffic,
    spec_cycle,
    state_scale_bytes,
)
from replayssm.traffic_kda import (  # noqa: F401 - the KDA byte model, re-exported
    kda_baseline_ar,
    kda_baseline_spec,
    kda_checkpoint_bytes,
    kda_commit_replay_spec,
    kda_entry_bytes,
    kda_input_bytes,
    kda_output_bytes,
    kda_replay_ar,
    kda_replay_ar_cycle,
    kda_replay_spec,
    kda_replay_spec_step,
    kda_scale_bytes,
    kda_stash_bytes,
    kda_state_bytes,
)

# ---------------------------------------------------------------------------------------------------------
# Mamba-2 sizes and FLOPs


def mamba2_state_bytes(geom: Mamba2Geometry, state_bytes: int = FP32) -> int:
    """The state's elements [H, P, N] (an 8-bit state's scales: mamba2_scale_bytes)."""
    return geom.nheads * geom.headdim * geom.dstate * state_bytes


def mamba2_scale_bytes(geom: Mamba2Geometry, state_bytes: int = FP32) -> int:
    """An 8-bit state's scales, one fp32 per head (0 at 2 and 4 bytes)."""
    return state_scale_bytes(geom.nheads, state_bytes)


def mamba2_checkpoint_bytes(geom: Mamba2Geometry, state_bytes: int = FP32) -> int:
    """What one read or write of the state moves: its elements and, for an 8-bit state, its scales."""
    return mamba2_state_bytes(geom, state_bytes) + mamba2_scale_bytes(geom, state_bytes)


def mamba2_input_bytes(geom: Mamba2Geometry, act_bytes: int = HALF) -> int:
    """One token's inputs: x [H, P], B and C [G, N] (act), raw dt [H] (fp32)."""
    g = geom
    return g.nheads * g.headdim * act_bytes + 2 * g.ngroups * g.dstate * act_bytes + g.nheads * CACHED_SCALAR_BYTES


def mamba2_output_bytes(geom: Mamba2Geometry, act_bytes: int = HALF) -> int:
    return geom.nheads * geom.headdim * act_bytes


def mamba2_entry_bytes(geom: Mamba2Geometry, act_bytes: int = HALF) -> int:
    """One cached token (AR buffer, spec ring, commit-replay stash): x [H, P], B [G, N] (act), dt [H] fp32.
    C is never cached (the official fork Johnny-Liou/ReplaySSM)."""
    g = geom
    return g.nheads * g.headdim * act_bytes + g.ngroups * g.dstate * act_bytes + g.nheads * CACHED_SCALAR_BYTES


def _mamba2_flops_baseline(geom: Mamba2Geometry) -> int:
    d, n = geom.headdim, geom.dstate
    return geom.nheads * 6 * d * n


def _mamba2_flops_state_and_output(geom: Mamba2Geometry, h: int) -> int:
    """Materialise S = a S0 + sum_{j<=h} s_j x_j B_j^T (rank h+1), then y = S C."""
    d, n = geom.headdim, geom.dstate
    return geom.nheads * (2 * (h + 1) * d * n + 2 * d * n + 2 * d * n)


def _mamba2_flops_output_only(geom: Mamba2Geometry, h: int) -> int:
    """y = a (S0 C) + sum_{j<=h} s_j (B_j . C) x_j: the state-building term 2(h+1)dn becomes 2(h+1)(d+n)."""
    d, n = geom.headdim, geom.dstate
    return geom.nheads * (2 * d * n + d + 2 * (h + 1) * n + n + 2 * (h + 1) * d)


def _mamba2_flops_spec_verify(geom: Mamba2Geometry, h: int, T: int, flush: bool) -> int:
    """Window of T from one checkpoint: T checkpoint readouts (S0 C_s), then the causal term over the h
    history entries and the window (B_k . C_s and the weighted sum of x_k, for k <= h + s). A flush step
    first rebuilds S1 from the h history entries (rank h + decay) and the causal term covers the window only."""
    d, n = geom.headdim, geom.dstate
    hist = 0 if flush else h
    causal = sum(2 * (hist + s + 1) * (n + d) for s in range(T))
    rebuild = (2 * h * d * n + 2 * d * n) if flush else 0
    return geom.nheads * (rebuild + 2 * T * d * n + causal)


# ---------------------------------------------------------------------------------------------------------
# Mamba-2 autoregressive decode


def mamba2_baseline_ar(geom: Mamba2Geometry, state_bytes: int = FP32, act_bytes: int = HALF) -> Traffic:
    """Selective state update: read + write the state; read x, B, C, dt; write y."""
    _check_geometry(geom, Mamba2Geometry)
    _check_dtypes(state_bytes, act_bytes)
    state = mamba2_checkpoint_bytes(geom, state_bytes)
    return Traffic(read=state + mamba2_input_bytes(geom, act_bytes),
                   write=state + mamba2_output_bytes(geom, act_bytes),
                   flops=_mamba2_flops_baseline(geom))


def mamba2_replay_ar(geom: Mamba2Geometry, L: int, h: int, route: str = "output_only", state_bytes: int = FP32,
                     act_bytes: int = HALF) -> Traffic:
    """ReplaySSM AR step at fill h (entries cached since the checkpoint), buffer length L.

    h < L-1: read the checkpoint, the h cached entries and the inputs; write y and append one entry.
    h == L-1 (flush): the same reads; write y and the new checkpoint, append nothing. Flushes always take
    the state-and-output route. With L = 1 every step is a flush at h = 0: exactly the baseline.
    """
    _check_geometry(geom, Mamba2Geometry)
    _check_dtypes(state_bytes, act_bytes)
    check_route(route)
    _check_int("L", L, 1)
    _check_int("h", h, 0, L - 1)
    state = mamba2_checkpoint_bytes(geom, state_bytes)
    entry = mamba2_entry_bytes(geom, act_bytes)
    flush = h == L - 1
    read = state + h * entry + mamba2_input_bytes(geom, act_bytes)
    write = mamba2_output_bytes(geom, act_bytes) + (state if flush else entry)
    if flush or route == "state_and_output":
        flops = _mamba2_flops_state_and_output(geom, h)
    else:
        flops = _mamba2_flops_output_only(geom, h)
    return Traffic(read=read, write=write, flops=flops)


def mamba2_replay_ar_cycle(geom: Mamba2Geometry, L: int, route: str = "output_only", state_bytes: int = FP32,
                           act_bytes: int = HALF) -> Traffic:
    """Mean step over one flush cycle h = 0..L-1 (what a timed run of L consecutive steps measures)."""
    _check_int("L", L, 1)
    return mean_traffic([mamba2_replay_ar(geom, L, h, route, state_bytes, act_bytes) for h in range(L)])


# ---------------------------------------------------------------------------------------------------------
# Mamba-2 speculative decode (window T = 1 + drafts; `accepted` in 1..T counts the bonus token)


def mamba2_baseline_spec(geom: Mamba2Geometry, T: int, state_bytes: int = FP32, act_bytes: int = HALF) -> Traffic:
    """vLLM native: read one state snapshot, run the window serially, write T snapshots (one per draft)."""
    _check_geometry(geom, Mamba2Geometry)
    _check_dtypes(state_bytes, act_bytes)
    _check_int("T", T, 1)
    state = mamba2_checkpoint_bytes(geom, state_bytes)
    return Traffic(read=state + T * mamba2_input_bytes(geom, act_bytes),
                   write=T * state + T * mamba2_output_bytes(geom, act_bytes),
                   flops=T * _mamba2_flops_baseline(geom))


def mamba2_commit_replay_spec(geom: Mamba2Geometry, T: int, accepted: int, state_bytes: int = FP32,
                              act_bytes: int = HALF) -> Traffic:
    """Commit-time replay: verify reads the frozen checkpoint once (serial window in registers, writes y
    and stashes the T entries); commit reads the checkpoint and the `accepted` stash entries and writes
    the checkpoint once (a rank-`accepted` update)."""
    _check_geometry(geom, Mamba2Geometry)
    _check_dtypes(state_bytes, act_bytes)
    _check_spec(T, accepted)
    state = mamba2_checkpoint_bytes(geom, state_bytes)
    entry = mamba2_entry_bytes(geom, act_bytes)
    d, n = geom.headdim, geom.dstate
    verify = Traffic(read=state + T * mamba2_input_bytes(geom, act_bytes),
                     write=T * mamba2_output_bytes(geom, act_bytes) + T * entry,
                     flops=T * _mamba2_flops_baseline(geom))
    commit = Traffic(read=state + accepted * entry, write=state,
                     flops=geom.nheads * (2 * accepted * d * n + 2 * d * n))
    return verify + commit


def mamba2_replay_spec_step(geom: Mamba2Geometry, T: int, h: int, flush: bool, state_bytes: int = FP32,
                            act_bytes: int = HALF) -> Traffic:
    """One ReplaySSM verify step with committed history h: read the checkpoint, the h history entries and
    the window's inputs; write the T window entries into the ring and the T outputs; a flush step also
    writes the rebuilt checkpoint (the commit kernel moves cursors only: no HBM traffic to speak of)."""
    state = mamba2_checkpoint_bytes(geom, state_bytes)
    entry = mamba2_entry_bytes(geom, act_bytes)
    return Traffic(read=state + h * entry + T * mamba2_input_bytes(geom, act_bytes),
                   write=T * entry + T * mamba2_output_bytes(geom, act_bytes) + (state if flush else 0),
                   flops=_mamba2_flops_spec_verify(geom, h, T, flush))


def mamba2_replay_spec(geom: Mamba2Geometry, B_hist: int, T: int, accepted: int, state_bytes: int = FP32,
                       act_bytes: int = HALF) -> Traffic:
    """Steady-state mean per step of ReplaySSM spec when every step accepts `accepted` tokens."""
    _check_geometry(geom, Mamba2Geometry)
    _check_dtypes(state_bytes, act_bytes)
    return mean_traffic([mamba2_replay_spec_step(geom, T, h, flush, state_bytes, act_bytes)
                         for h, flush in spec_cycle(B_hist, T, accepted)])




# ---------------------------------------------------------------------------------------------------------
# GDN autoregressive decode (ReplaySSM uses the state-and-output route only: it needs S k and S q)


def gdn_baseline_ar(geom: GDNGeometry, state_bytes: int = FP32, act_bytes: int = HALF) -> Traffic:
    """Fused recurrent step: read + write the state; read q, k, v, g, beta; write o."""
    _check_geometry(geom, GDNGeometry)
    _check_dtypes(state_bytes, act_bytes)
    state = gdn_checkpoint_bytes(geom, state_bytes)
    return Traffic(read=state + gdn_input_bytes(geom, act_bytes),
                   write=state + gdn_output_bytes(geom, act_bytes),
                   flops=_gdn_flops_baseline_token(geom))


def gdn_replay_ar(geom: GDNGeometry, L: int, h: int, state_bytes: int = FP32, act_bytes: int = HALF,
                  route: str = "output_only") -> Traffic:
    """ReplaySSM GDN AR step at fill h: as `mamba2_replay_ar` with the (u, k, g) entry; h == L-1 flushes.
    The kernel folds the rebuilt S_h tile it still holds in registers, so a flush reads the state once too
    (scripts/kernels/kernel_traffic.py checks issued against unique state loads). The route changes the FLOPs
    only: both read the checkpoint once and the same buffer entries."""
    _check_geometry(geom, GDNGeometry)
    _check_dtypes(state_bytes, act_bytes)
    _check_int("L", L, 1)
    _check_int("h", h, 0, L - 1)
    state = gdn_checkpoint_bytes(geom, state_bytes)
    entry = gdn_entry_bytes(geom, act_bytes)
    flush = h == L - 1
    return Traffic(read=state + h * entry + gdn_input_bytes(geom, act_bytes),
                   write=gdn_output_bytes(geom, act_bytes) + (state if flush else entry),
                   flops=_gdn_flops_replay(geom, h, flush, route))


def gdn_replay_ar_cycle(geom: GDNGeometry, L: int, state_bytes: int = FP32, act_bytes: int = HALF,
                        route: str = "output_only") -> Traffic:
    """Mean step over one flush cycle h = 0..L-1."""
    _check_int("L", L, 1)
    return mean_traffic([gdn_replay_ar(geom, L, h, state_bytes, act_bytes, route) for h in range(L)])


# ---------------------------------------------------------------------------------------------------------
# GDN speculative decode


def gdn_baseline_spec(geom: GDNGeometry, T: int, state_bytes: int = FP32, act_bytes: int = HALF) -> Traffic:
    """vLLM native: one state read, T snapshot writes, the window's inputs and outputs."""
    _check_geometry(geom, GDNGeometry)
    _check_dtypes(state_bytes, act_bytes)
    _check_int("T", T, 1)
    state = gdn_checkpoint_bytes(geom, state_bytes)
    return Traffic(read=state + T * gdn_input_bytes(geom, act_bytes),
                   write=T * state + T * gdn_output_bytes(geom, act_bytes),
                   flops=T * _gdn_flops_baseline_token(geom))


def gdn_commit_replay_spec(geom: GDNGeometry, T: int, accepted: int, state_bytes: int = FP32,
                           act_bytes: int = HALF) -> Traffic:
    """Commit-time replay (FlashInfer style): verify reads the frozen checkpoint once, runs the window
    serially in registers, writes o and stashes raw (v, k, g, beta); commit reads the checkpoint and the
    `accepted` stash entries, re-runs them serially (no readout) and writes the checkpoint once."""
    _check_geometry(geom, GDNGeometry)
    _check_dtypes(state_bytes, act_bytes)
    _check_spec(T, accepted)
    state = gdn_checkpoint_bytes(geom, state_bytes)
    stash = gdn_stash_bytes(geom, act_bytes)
    verify = Traffic(read=state + T * gdn_input_bytes(geom, act_bytes),
                     write=T * gdn_output_bytes(geom, act_bytes) + T * stash,
                     flops=T * _gdn_flops_baseline_token(geom))
    commit = Traffic(read=state + accepted * stash, write=state,
                     flops=accepted * _gdn_flops_baseline_token(geom, readout=False))
    return verify + commit


def gdn_replay_spec_step(geom: GDNGeometry, T: int, h: int, flush: bool, state_bytes: int = FP32,
                         act_bytes: int = HALF) -> Traffic:
    """One ReplaySSM GDN verify step with committed history h (see `mamba2_replay_spec_step`)."""
    state = gdn_checkpoint_bytes(geom, state_bytes)
    entry = gdn_entry_bytes(geom, act_bytes)
    return Traffic(read=state + h * entry + T * gdn_input_bytes(geom, act_bytes),
                   write=T * entry + T * gdn_output_bytes(geom, act_bytes) + (state if flush else 0),
                   flops=_gdn_flops_spec_verify(geom, h, T, flush))


def gdn_replay_spec(geom: GDNGeometry, B_hist: int, T: int, accepted: int, state_bytes: int = FP32,
                    act_bytes: int = HALF) -> Traffic:
    """Steady-state mean per step of ReplaySSM GDN spec when every step accepts `accepted` tokens."""
    _check_geometry(geom, GDNGeometry)
    _check_dtypes(state_bytes, act_bytes)
    return mean_traffic([gdn_replay_spec_step(geom, T, h, flush, state_bytes, act_bytes)
                         for h, flush in spec_cycle(B_hist, T, accepted)])


# ---------------------------------------------------------------------------------------------------------
# persistent footprint per sequence per layer (max concurrency under an HBM budget)

_CURSOR = 4  # one int32 per slot


def cache_footprint(method: str, geom: Mamba2Geometry | GDNGeometry, *, L: int | None = None,
                    B_hist: int | None = None, T: int | None = None, state_bytes: int = FP32,
                    act_bytes: int = HALF) -> Footprint:
    """Persistent bytes one sequence holds in one layer, for `method` in
    "baseline_ar" (state), "replay_ar" (checkpoint + L entries; needs L), "baseline_spec" (T snapshots, as
    vLLM allocates 1 + num_spec blocks; needs T), "replay_spec" (checkpoint + ring of next_pow2(B + T)
    entries; needs B_hist, T), "commit_replay_spec" (checkpoint + T-entry stash; needs T).
    `scratch` holds what this repo's caches also allocate per slot (cursors, the Mamba-2 bc scratch), and
    `scales` an 8-bit state's per-(slot, head) fp32 scales (one set per state held), so `total` matches
    `cache.nbytes() / num_slots`."""
    _check_dtypes(state_bytes, act_bytes)
    if isinstance(geom, Mamba2Geometry):
        fam, bc_per_row = "mamba2", geom.ngroups * FP32  # bc scratch: one fp32 per (group, buffer row[, window pos])
    elif isinstance(geom, GDNGeometry):
        fam, bc_per_row = "gdn", 0
    elif isinstance(geom, KDAGeometry):
        fam, bc_per_row = "kda", 0
    else:
        raise ValueError(f"expected a Mamba2Geometry, GDNGeometry or KDAGeometry, got {type(geom).__name__}")
    state = globals()[f"{fam}_state_bytes"](geom, state_bytes)
    scale = globals()[f"{fam}_scale_bytes"](geom, state_bytes)     # 8-bit state: one fp32 per (slot, head)
    entry = globals()[f"{fam}_entry_bytes"](geom, act_bytes)
    stash = entry if fam == "mamba2" else globals()[f"{fam}_stash_bytes"](geom, act_bytes)

    if method == "baseline_ar":
        return Footprint(states=state, buffers=0, scales=scale)
    if method == "replay_ar":
        _check_int("L", L, 1)
        return Footprint(states=state, buffers=L * entry, scratch=L * bc_per_row + _CURSOR, scales=scale)
    if method == "baseline_spec":
        _check_int("T", T, 1)
        return Footprint(states=T * state, buffers=0, scratch=_CURSOR,    # which snapshot is the committed one
                         scales=T * scale)
    if method == "replay_spec":
        _check_spec(T, 1, B_hist)
        ring = next_pow2(B_hist + T)
        return Footprint(states=state, buffers=ring * entry, scratch=ring * T * bc_per_row + 3 * _CURSOR,
                         scales=scale)
    if method == "commit_replay_spec":
        _check_int("T", T, 1)
        return Footprint(states=state, buffers=T * stash, scales=scale)
    raise ValueError(f"unknown method {method!r}; expected baseline_ar, replay_ar, baseline_spec, replay_spec "
                     "or commit_replay_spec")


def max_concurrency(hbm_budget_bytes: int, footprint: Footprint, num_layers: int) -> int:
    """Sequences whose SSM caches fit in `hbm_budget_bytes` when each holds `footprint` in each of
    `num_layers` SSM layers."""
    _check_int("num_layers", num_layers, 1)
    if hbm_budget_bytes < 0:
        raise ValueError(f"hbm_budget_bytes must be >= 0, got {hbm_budget_bytes}")
    return int(hbm_budget_bytes // (footprint.total * num_layers))


# ---------------------------------------------------------------------------------------------------------
# tree speculation (replayssm/tree_ring.py): N tree nodes, accepted branch of `accepted` nodes (1..depth)

TREE_METHODS = ("replay_tree", "native_tree", "commit_replay_tree", "stree")


def tree_cycle(B_hist: int, N: int, depth: int, accepted: int) -> list[tuple[int, bool]]:
    """Steady-state (history h, is_flush) cycle of the tree ring at a fixed accepted count: as spec_cycle with
    the tree rule is_flush_next = write_pos + depth + N > B_hist + N."""
    _check_int("N", N, 1)
    _check_int("depth", depth, 1, N)
    _check_int("accepted", accepted, 1, depth)
    _check_int("B_hist", B_hist, N)
    write_pos, is_flush = 0, False
    first_seen: dict[tuple[int, bool], int] = {}
    steps: list[tuple[int, bool]] = []
    while (write_pos, is_flush) not in first_seen:
        first_seen[(write_pos, is_flush)] = len(steps)
        steps.append((write_pos, is_flush))
        write_pos = accepted if is_flush else write_pos + accepted
        is_flush = write_pos + depth > B_hist
    return steps[first_seen[(write_pos, is_flush)]:]


def tree_traffic(geom, method: str, N: int, depth: int, accepted: int, B_hist: int = 16, state_bytes: int = FP32,
                 act_bytes: int = HALF) -> Traffic:
    """Mean bytes per step of one SSM layer verifying an N-node tree and committing `accepted` nodes.

    replay_tree  ReplaySSM ring: the chain verify step with N window entries (checkpoint read, history read,
                 N entries and outputs written, the checkpoint written on flush steps only) plus the commit's
                 moves of up to accepted - 1 entries (read + write each; a chain moves none: counted as the
                 worst case).
    native_tree  one snapshot per node: 1 state read + N state writes (the chain baseline with T = N).
    stree        STree's activation replay (arXiv 2505.14969): each step replays the previous step's accepted
                 nodes into the state and writes it (1 state read + 1 state write per step) and stashes the
                 N nodes' inputs for the next replay.
    commit_replay_tree  the same with the replay in a separate commit: the state is read twice a step.
    """
    if method not in TREE_METHODS:
        raise ValueError(f"method={method!r}: expected one of {TREE_METHODS}")
    if not isinstance(geom, (Mamba2Geometry, GDNGeometry, KDAGeometry)):
        raise ValueError(f"expected a Mamba2Geometry, GDNGeometry or KDAGeometry, got {type(geom).__name__}")
    fam = "mamba2" if isinstance(geom, Mamba2Geometry) else "kda" if isinstance(geom, KDAGeometry) else "gdn"
    _check_dtypes(state_bytes, act_bytes)
    names = ("checkpoint_bytes", "entry_bytes", "baseline_spec", "replay_spec_step", "input_bytes", "output_bytes")
    f = {name: globals()[f"{fam}_{name}"] for name in names}
    state, entry = f["checkpoint_bytes"](geom, state_bytes), f["entry_bytes"](geom, act_bytes)
    if method == "native_tree":
        return f["baseline_spec"](geom, N, state_bytes, act_bytes)
    if method == "replay_tree":
        step = f["replay_spec_step"]
        verify = mean_traffic([step(geom, N, h, flush, state_bytes, act_bytes)
                               for h, flush in tree_cycle(B_hist, N, depth, accepted)])
        moves = (accepted - 1) * entry
        return verify + Traffic(read=moves, write=moves, flops=0)
    inputs, outputs = f["input_bytes"](geom, act_bytes), f["output_bytes"](geom, act_bytes)
    reads = 2 if method == "commit_replay_tree" else 1
    return Traffic(read=reads * state + accepted * entry + N * inputs, write=state + N * entry + N * outputs,
                   flops=f["baseline_spec"](geom, N).flops)

