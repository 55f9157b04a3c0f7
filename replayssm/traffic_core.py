"""The accounting units of the byte model (replayssm/traffic.py, replayssm/traffic_kda.py): Traffic and Footprint,
the dtype sizes, the argument checks, the speculative ring's steady-state cycle, and the delta-rule sizes and FLOPs
that GDN's model (traffic.py) and KDA's (traffic_kda.py) both build on. Kept apart so that traffic.py can import
traffic_kda.py without a circle; traffic.py re-exports every name here."""

from __future__ import annotations

from dataclasses import dataclass

from replayssm.checks import ROUTES, check_route  # noqa: F401 - ROUTES re-exported (traffic.ROUTES)
from replayssm.geometry import GDNGeometry

FP32 = 4
HALF = 2                       # bf16 / fp16
EIGHT_BIT = 1                  # int8 / fp8 e4m3 state: one byte per element plus a per-(slot, head) fp32 scale
STATE_BYTES = (EIGHT_BIT, HALF, FP32)
SCALE_BYTES = FP32             # one fp32 scale per (slot, head) of an 8-bit state (replayssm/fp8_checkpoint.py)
CACHED_SCALAR_BYTES = FP32     # cached dt / g, and the raw dt, g, beta inputs


def state_scale_bytes(nheads: int, state_bytes: int) -> int:
    """Bytes of the scales beside one sequence's state of `nheads` heads: an 8-bit state stores one fp32 scale per
    (slot, head) (state_scale [num_slots, nheads]; a reader reads it with the head's block, a writer writes it
    with the block); a 2- or 4-byte state has none."""
    return nheads * SCALE_BYTES if state_bytes == EIGHT_BIT else 0


@dataclass(frozen=True)
class Traffic:
    """HBM bytes read and written, and FLOPs, of one step (ints), or a mean over steps (fractional)."""

    read: float
    write: float
    flops: float

    @property
    def total(self) -> float:
        """Bytes moved, read + write."""
        return self.read + self.write

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte."""
        return self.flops / self.total

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.read + other.read, self.write + other.write, self.flops + other.flops)

    def __mul__(self, k: float) -> Traffic:
        return Traffic(self.read * k, self.write * k, self.flops * k)

    __rmul__ = __mul__

    def __truediv__(self, k: float) -> Traffic:
        return Traffic(self.read / k, self.write / k, self.flops / k)


def mean_traffic(steps: list[Traffic]) -> Traffic:
    """The mean step of a cycle."""
    if not steps:
        raise ValueError("mean_traffic needs at least one step")
    total = steps[0]
    for s in steps[1:]:
        total = total + s
    return total / len(steps)


@dataclass(frozen=True)
class Footprint:
    """Persistent bytes per sequence per layer: recurrent state(s), input buffers/rings, the small rest
    (cursors and per-slot scratch) that the caches in this repo also allocate, and an 8-bit state's per-head
    fp32 scales (0 for a 2- or 4-byte state)."""

    states: int
    buffers: int
    scratch: int = 0
    scales: int = 0

    @property
    def total(self) -> int:
        return self.states + self.buffers + self.scratch + self.scales


# ---------------------------------------------------------------------------------------------------------
# validation


def _check_geometry(geom, cls) -> None:
    if not isinstance(geom, cls):
        raise ValueError(f"expected a {cls.__name__}, got {type(geom).__name__}")


def _check_int(name: str, value, lo: int, hi: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")


def _check_dtypes(state_bytes: int, act_bytes: int) -> None:
    if state_bytes not in STATE_BYTES:
        raise ValueError(f"state_bytes must be 1 (int8 / fp8, with per-head fp32 scales), 2 (fp16) or 4 (fp32), "
                         f"got {state_bytes!r}")
    if act_bytes not in (2, 4):
        raise ValueError(f"act_bytes must be 2 (bf16/fp16) or 4 (fp32), got {act_bytes!r}")


def _check_spec(T: int, accepted: int, B_hist: int | None = None) -> None:
    _check_int("T", T, 1)
    _check_int("accepted", accepted, 1, T)
    if B_hist is not None:
        _check_int("B_hist", B_hist, 1)
        if B_hist < T:
            raise ValueError(f"B_hist={B_hist} < T={T}: the ring needs B >= T")


# ---------------------------------------------------------------------------------------------------------
# the speculative ring's cursor protocol (the official fork Johnny-Liou/ReplaySSM), simulated at a fixed acceptance


def spec_cycle(B_hist: int, T: int, accepted: int) -> list[tuple[int, bool]]:
    """The steady-state cycle of (history h, is_flush) seen by verify when every step accepts `accepted`.

    Commit: after a flush step write_pos = accepted, else write_pos += accepted; then
    is_flush_next = write_pos + 2T > B_hist + T. A reset row starts at write_pos 0, is_flush = 2T > B + T.
    """
    _check_spec(T, accepted, B_hist)
    write_pos, is_flush = 0, 2 * T > B_hist + T
    first_seen: dict[tuple[int, bool], int] = {}
    steps: list[tuple[int, bool]] = []
    while (write_pos, is_flush) not in first_seen:
        first_seen[(write_pos, is_flush)] = len(steps)
        steps.append((write_pos, is_flush))
        write_pos = accepted if is_flush else write_pos + accepted
        is_flush = write_pos + 2 * T > B_hist + T
    return steps[first_seen[(write_pos, is_flush)]:]


# ---------------------------------------------------------------------------------------------------------
# GDN sizes and FLOPs


def gdn_state_bytes(geom: GDNGeometry, state_bytes: int = FP32) -> int:
    """The state's elements [HV, V, K] (an 8-bit state's scales: gdn_scale_bytes)."""
    return geom.HV * geom.V * geom.K * state_bytes


def gdn_scale_bytes(geom: GDNGeometry, state_bytes: int = FP32) -> int:
    """An 8-bit state's scales, one fp32 per value head (0 at 2 and 4 bytes)."""
    return state_scale_bytes(geom.HV, state_bytes)


def gdn_checkpoint_bytes(geom: GDNGeometry, state_bytes: int = FP32) -> int:
    """What one read or write of the state moves: its elements and, for an 8-bit state, its scales."""
    return gdn_state_bytes(geom, state_bytes) + gdn_scale_bytes(geom, state_bytes)


def gdn_input_bytes(geom: GDNGeometry, act_bytes: int = HALF) -> int:
    """One token's inputs: q, k [H, K], v [HV, V] (act); g, beta [HV] (fp32)."""
    g = geom
    return 2 * g.H * g.K * act_bytes + g.HV * g.V * act_bytes + 2 * g.HV * CACHED_SCALAR_BYTES


def gdn_output_bytes(geom: GDNGeometry, act_bytes: int = HALF) -> int:
    return geom.HV * geom.V * act_bytes


def gdn_entry_bytes(geom: GDNGeometry, act_bytes: int = HALF) -> int:
    """One ReplaySSM cached token: corrected update u [HV, V], key k [H, K] (act), log decay g [HV] fp32."""
    g = geom
    return g.HV * g.V * act_bytes + g.H * g.K * act_bytes + g.HV * CACHED_SCALAR_BYTES


def gdn_stash_bytes(geom: GDNGeometry, act_bytes: int = HALF) -> int:
    """One commit-replay stash token: raw v [HV, V], k [H, K] (act), g, beta [HV] fp32 (u cannot be
    stashed: it depends on the state at the token, which the commit recomputes serially)."""
    g = geom
    return g.HV * g.V * act_bytes + g.H * g.K * act_bytes + 2 * g.HV * CACHED_SCALAR_BYTES


def _gdn_flops_baseline_token(geom: GDNGeometry, readout: bool = True) -> int:
    """Decay alpha S (VK), S k (2VK), rank-1 update (2VK), S q (2VK, if `readout`); u = beta (v - S k) (2V)."""
    VK = geom.V * geom.K
    return geom.HV * (VK + 2 * VK + 2 * VK + (2 * VK if readout else 0) + 2 * geom.V)


def _gdn_flops_replay(geom: GDNGeometry, h: int, flush: bool, route: str = "output_only") -> int:
    """State-and-output (and every flush): rebuild S_h = e^G S0 + sum_{j<h} w_j u_j k_j^T (VK + 2hVK, nothing
    when h = 0), read it with k and q (4VK), the token's vector work (u: 3V; o = alpha S_h q + u (k . q):
    3V + 2K); a flush writes alpha S_h + u k^T (3VK). Output-only (normal steps): S0 read with k and q (4VK),
    the buffered keys with the same two (4hK) and their u rows summed with those weights (4hV), the same
    token work: S_h is never formed."""
    check_route(route)
    V, K = geom.V, geom.K
    VK = V * K
    if route == "output_only_fold":       # the output-only readout on every step; a flush adds the buffer fold
        fold = VK + 2 * (h + 1) * VK if flush else 0     # e^G S0 + (u w) @ k_buf over h + 1 entries
        return geom.HV * (4 * VK + 4 * h * (K + V) + 6 * V + 2 * K + fold)
    if route == "output_only" and not flush:
        return geom.HV * (4 * VK + 4 * h * (K + V) + 6 * V + 2 * K)
    rebuild = (VK + 2 * h * VK) if h else 0
    fold = 3 * VK if flush else 0
    return geom.HV * (rebuild + 4 * VK + 6 * V + 2 * K + fold)


def _gdn_flops_spec_verify(geom: GDNGeometry, h: int, T: int, flush: bool) -> int:
    """What the verify kernel computes (replayssm/gdn/spec_kernels.py), flush or not: it rebuilds S_h from the
    checkpoint and the h history entries with a GEMM over the history (VK + 2hVK, nothing when h = 0; a flush
    row also stores it), reads it with the T keys and T queries (4T VK) and forms the Gram matrix of the 2T
    stacked window rows (2 (2T)^2 K). The T x T system is solved by T substitution steps, each a [T, T] x [T, V]
    product (2T^3 V), and the intra-window output is one [T, T] x [T, V] product (2T^2 V). Counted at the
    logical sizes: the padding of the history and window axes to 16 rows (tensor-core tiles) is not."""
    V, K = geom.V, geom.K
    VK = V * K
    rebuild = (VK + 2 * h * VK) if h else 0
    readout = 4 * T * VK
    window = 2 * (2 * T) ** 2 * K + 2 * T ** 3 * V + 2 * T * T * V
    return geom.HV * (rebuild + readout + window)
