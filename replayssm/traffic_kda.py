"""The byte model of Kimi Delta Attention (replayssm.kda, baselines/kda_*): GDN's (replayssm/traffic.py) with
the log decay g a K-vector per value head and token instead of one fp32.

KDA shapes per sequence (key heads H, value heads HV, K, V):
    state [HV, V, K]; inputs q, k [H, K], v [HV, V] (act), g [HV, K], beta [HV] fp32; output o [HV, V];
    ReplaySSM entry: u [HV, V], k [H, K] (act), g [HV, K] fp32: K fp32 per value head where GDN's holds one,
    (K - 1) * HV * 4 more bytes per entry (Kimi-Linear, 32 heads x 128 x 128: 32,768 bytes where GDN's entry at
    the same head shape is 16,512, 1.98x);
    commit-replay stash: raw v, k, g [HV, K], beta.
The state bytes, the step structure (what each method reads and writes) and the flush cycle are GDN's, so the
functions below are GDN's with these sizes. FLOPs: GDN's count plus what the per-channel decay adds, per value
head: AR, the buffer's per-channel prefix sums and key weights (3hK: add, exp, multiply) and the decayed k, q
(3K); the verify, the same 3hK for the history, the window's per-channel path sums (2T * T * K), the decayed
readout rows (2 * 2T * K) and the decay-weighted key dots formed pairwise (5 per pair and channel, 2T x T
pairs) where GDN's Gram matrix is one GEMM (2 (2T)^2 K).
"""

from __future__ import annotations

from replayssm.geometry import KDAGeometry
from replayssm.traffic_core import (
    CACHED_SCALAR_BYTES,
    FP32,
    HALF,
    Traffic,
    _check_dtypes,
    _check_geometry,
    _check_int,
    _check_spec,
    _gdn_flops_baseline_token,
    _gdn_flops_replay,
    _gdn_flops_spec_verify,
    gdn_checkpoint_bytes,
    gdn_output_bytes,
    gdn_scale_bytes,
    gdn_state_bytes,
    mean_traffic,
    spec_cycle,
)

__all__ = ["kda_state_bytes", "kda_scale_bytes", "kda_checkpoint_bytes",
           "kda_input_bytes", "kda_output_bytes", "kda_entry_bytes", "kda_stash_bytes",
           "kda_baseline_ar", "kda_replay_ar", "kda_replay_ar_cycle", "kda_baseline_spec", "kda_commit_replay_spec",
           "kda_replay_spec_step", "kda_replay_spec"]


def kda_state_bytes(geom: KDAGeometry, state_bytes: int = FP32) -> int:
    return gdn_state_bytes(geom, state_bytes)


def kda_scale_bytes(geom: KDAGeometry, state_bytes: int = FP32) -> int:
    """An 8-bit state's scales, one fp32 per value head (0 at 2 and 4 bytes), as GDN's."""
    return gdn_scale_bytes(geom, state_bytes)


def kda_checkpoint_bytes(geom: KDAGeometry, state_bytes: int = FP32) -> int:
    """One read or write of the state: its elements and an 8-bit state's scales."""
    return gdn_checkpoint_bytes(geom, state_bytes)


def kda_output_bytes(geom: KDAGeometry, act_bytes: int = HALF) -> int:
    return gdn_output_bytes(geom, act_bytes)


def kda_input_bytes(geom: KDAGeometry, act_bytes: int = HALF) -> int:
    """One token's inputs: q, k [H, K], v [HV, V] (act); g [HV, K], beta [HV] (fp32)."""
    g = geom
    return 2 * g.H * g.K * act_bytes + g.HV * g.V * act_bytes + g.HV * (g.K + 1) * CACHED_SCALAR_BYTES


def kda_entry_bytes(geom: KDAGeometry, act_bytes: int = HALF) -> int:
    """One ReplaySSM cached token: u [HV, V], k [H, K] (act), g [HV, K] fp32."""
    g = geom
    return g.HV * g.V * act_bytes + g.H * g.K * act_bytes + g.HV * g.K * CACHED_SCALAR_BYTES


def kda_stash_bytes(geom: KDAGeometry, act_bytes: int = HALF) -> int:
    """One commit-replay stash token: raw v [HV, V], k [H, K] (act), g [HV, K], beta [HV] fp32."""
    g = geom
    return g.HV * g.V * act_bytes + g.H * g.K * act_bytes + g.HV * (g.K + 1) * CACHED_SCALAR_BYTES


def _flops_baseline_token(geom: KDAGeometry, readout: bool = True) -> int:
    """GDN's step with exp over the K channels of g instead of one."""
    return _gdn_flops_baseline_token(geom, readout) + geom.HV * (geom.K - 1)


def _flops_replay(geom: KDAGeometry, h: int, flush: bool, route: str = "output_only") -> int:
    return _gdn_flops_replay(geom, h, flush, route) + geom.HV * (3 * h * geom.K + 3 * geom.K)


def _flops_spec_verify(geom: KDAGeometry, h: int, T: int, flush: bool) -> int:
    K = geom.K
    window = 2 * T * T * K + 2 * (2 * T) * K + 5 * (2 * T) * T * K - 2 * (2 * T) ** 2 * K
    return _gdn_flops_spec_verify(geom, h, T, flush) + geom.HV * (3 * h * K + window)


def _check(geom, state_bytes: int, act_bytes: int) -> None:
    _check_geometry(geom, KDAGeometry)
    _check_dtypes(state_bytes, act_bytes)


def kda_baseline_ar(geom: KDAGeometry, state_bytes: int = FP32, act_bytes: int = HALF) -> Traffic:
    """Fused recurrent step: read + write the state; read q, k, v, g, beta; write o."""
    _check(geom, state_bytes, act_bytes)
    state = kda_checkpoint_bytes(geom, state_bytes)
    return Traffic(read=state + kda_input_bytes(geom, act_bytes), write=state + kda_output_bytes(geom, act_bytes),
                   flops=_flops_baseline_token(geom))


def kda_replay_ar(geom: KDAGeometry, L: int, h: int, state_bytes: int = FP32, act_bytes: int = HALF,
                  route: str = "output_only") -> Traffic:
    """ReplaySSM KDA AR step at fill h (h == L - 1 flushes): GDN's structure with the KDA entry."""
    _check(geom, state_bytes, act_bytes)
    _check_int("L", L, 1)
    _check_int("h", h, 0, L - 1)
    state, entry = kda_checkpoint_bytes(geom, state_bytes), kda_entry_bytes(geom, act_bytes)
    flush = h == L - 1
    return Traffic(read=state + h * entry + kda_input_bytes(geom, act_bytes),
                   write=kda_output_bytes(geom, act_bytes) + (state if flush else entry),
                   flops=_flops_replay(geom, h, flush, route))


def kda_replay_ar_cycle(geom: KDAGeometry, L: int, state_bytes: int = FP32, act_bytes: int = HALF,
                        route: str = "output_only") -> Traffic:
    """Mean step over one flush cycle h = 0..L-1 (the route changes the FLOPs only, as GDN's)."""
    _check_int("L", L, 1)
    return mean_traffic([kda_replay_ar(geom, L, h, state_bytes, act_bytes, route) for h in range(L)])


def kda_baseline_spec(geom: KDAGeometry, T: int, state_bytes: int = FP32, act_bytes: int = HALF) -> Traffic:
    """Native spec: one state read, T snapshot writes, the window's inputs and outputs."""
    _check(geom, state_bytes, act_bytes)
    _check_int("T", T, 1)
    state = kda_checkpoint_bytes(geom, state_bytes)
    return Traffic(read=state + T * kda_input_bytes(geom, act_bytes),
                   write=T * state + T * kda_output_bytes(geom, act_bytes), flops=T * _flops_baseline_token(geom))


def kda_commit_replay_spec(geom: KDAGeometry, T: int, accepted: int, state_bytes: int = FP32,
                           act_bytes: int = HALF) -> Traffic:
    """Commit-time replay: verify reads the frozen state once and stashes raw (v, k, g, beta); commit re-reads
    the state and `accepted` stash entries and writes the state once."""
    _check(geom, state_bytes, act_bytes)
    _check_spec(T, accepted)
    state, stash = kda_checkpoint_bytes(geom, state_bytes), kda_stash_bytes(geom, act_bytes)
    verify = Traffic(read=state + T * kda_input_bytes(geom, act_bytes),
                     write=T * kda_output_bytes(geom, act_bytes) + T * stash, flops=T * _flops_baseline_token(geom))
    commit = Traffic(read=state + accepted * stash, write=state,
                     flops=accepted * _flops_baseline_token(geom, readout=False))
    return verify + commit


def kda_replay_spec_step(geom: KDAGeometry, T: int, h: int, flush: bool, state_bytes: int = FP32,
                         act_bytes: int = HALF) -> Traffic:
    """One ReplaySSM KDA verify step with committed history h."""
    state, entry = kda_checkpoint_bytes(geom, state_bytes), kda_entry_bytes(geom, act_bytes)
    return Traffic(read=state + h * entry + T * kda_input_bytes(geom, act_bytes),
                   write=T * entry + T * kda_output_bytes(geom, act_bytes) + (state if flush else 0),
                   flops=_flops_spec_verify(geom, h, T, flush))


def kda_replay_spec(geom: KDAGeometry, B_hist: int, T: int, accepted: int, state_bytes: int = FP32,
                    act_bytes: int = HALF) -> Traffic:
    """Steady-state mean per step of ReplaySSM KDA spec when every step accepts `accepted` tokens."""
    _check(geom, state_bytes, act_bytes)
    return mean_traffic([kda_replay_spec_step(geom, T, h, flush, state_bytes, act_bytes)
                         for h, flush in spec_cycle(B_hist, T, accepted)])
