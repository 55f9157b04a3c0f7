"""Time per decode step of one SSM layer on a named GPU: the byte model (replayssm/traffic.py) made into seconds.

    t(method, batch) = max(batch * bytes / bandwidth, batch * FLOPs / fp32 SIMT peak, instructions / issue rate)
                       + launches * launch floor

The first two terms are the roofline of the traffic model's own bytes and FLOPs (per sequence, scaled by the
batch: every sequence owns its state); the third is the issue floor, the warp-instructions of the step's Triton
kernels (replayssm/issue_table.py: counted from their SASS by the kernel report, programs x warps x instructions
on the executed path) over the SMs' sustained issue rate (Hardware.issue_rate: issues per cycle per scheduler x
schedulers x SMs x clock), so a kernel bound by instruction issue rather than bytes is modelled so (the H200's
GDN replay step: results/h200/route-check-*); the last is a floor per kernel launch, paid whatever the batch.
A kernel's issue rate grows with its resident warps (Little's law on the scheduler: warps per scheduler over the
cycles between one warp's issues, at most one issue per cycle), so the rate comes from each kernel's occupancy. At
large batch the bytes term dominates and the speedup tends to the byte ratio (~1.8x at fp32 state); at batch 1
a ReplaySSM step moves ~half the bytes of a ~2-3 us baseline step but launches more kernels (Mamba-2's output-only
route: a B.C precompute, the step and the cursor advance, against the baseline's one selective-state-update
kernel), so the floor decides and the method loses: the batch-1 loss the published record shows.

Every parameter names its source (HARDWARE, LAUNCH_FLOOR_S, LAUNCHES); none is fitted to the published cells.
`launch_floor_from_csv` reads this harness's own measurement (experiments/launch_floor.py's launch_floor.csv,
the minimal kernel's median, under CUDA graphs) where a GPU run has one; `launches_from_csv` reads the launches
per step that run counted.

What the model leaves out (a disagreement with a published cell names one of these): the latency of a grid too
small to keep the HBM pipes full (batch 1 on a 148-SM B300), the measured fraction of peak bandwidth a kernel
reaches (the model uses 100% for every method, so ratios are unaffected while both are bandwidth-bound),
L2 residency, tensor cores for the spec window's small GEMMs, and serving effects (scheduling, sampling).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from replayssm import traffic
from replayssm.geometry import GDNGeometry, KDAGeometry, Mamba2Geometry


@dataclass(frozen=True)
class Hardware:
    """Datasheet peaks of one GPU, decimal units. `tensor_flops`: dense bf16 tensor-core peak (the other layers'
    GEMMs in a whole-model step); `hbm_bytes`: memory capacity. The issue floor's terms: `sms`, `sm_clock_hz`,
    `warp_issue_cycles` (cycles between two issues of one warp: a scheduler with w resident warps issues
    min(1, w / warp_issue_cycles) per cycle), `schedulers` per SM, `arch` (the sm_XX whose compiled kernels
    issue_table holds; 0: none), with `issue_source`."""

    name: str
    hbm_Bps: float
    simt_fp32_flops: float
    tensor_flops: float
    hbm_bytes: float
    source: str
    sms: int = 0
    sm_clock_hz: float = 0.0
    warp_issue_cycles: float = 0.0
    arch: int = 0
    issue_source: str = ""
    schedulers: int = 4

    def issue_per_cycle(self, warps_per_sm: float) -> float:
        """Warp-instructions one scheduler issues per cycle with `warps_per_sm` resident warps (0: unknown)."""
        if not self.warp_issue_cycles:
            return 0.0
        return min(1.0, warps_per_sm / self.schedulers / self.warp_issue_cycles)

    def issue_rate(self, warps_per_sm: float) -> float:
        """Warp-instructions the whole GPU issues per second at that occupancy (0 when the issue terms are unknown)."""
        return self.issue_per_cycle(warps_per_sm) * self.schedulers * self.sms * self.sm_clock_hz

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a kernel is compute-bound on the SIMT cores (the roofline's ridge point)."""
        return self.simt_fp32_flops / self.hbm_Bps


# The issue floor's rate, measured on the H200 by ncu (results/h200/route-check-20261204T130226Z-feec103/ncu): the GDN
# output-only step, 3 resident warps per scheduler (163 registers), issued 0.49 and 0.46 warp-instructions per cycle per
# scheduler at 1.5 GHz, 5.93 and 6.29 cycles between one warp's issues: 6 cycles, so 0.5 per cycle at its occupancy.
# Other kernels' intervals were not measured: the same 6 is ASSUMED. It is a floor there (the state-and-output step,
# 6.8 warps per scheduler, took 8.5 cycles, 0.80 issues per cycle: its time is 1.25x this floor; the AR baseline,
# bandwidth-bound at 9.6 warps, issued 0.56).
H200_ISSUE = ("ncu on the H200 (results/h200/route-check-20261204T130226Z-feec103/ncu): 132 SMs, 4 schedulers, 1.5 GHz "
              "SM clock under ncu; 5.93-6.29 cycles between a warp's issues on the GDN replay step (0.49 issues per "
              "cycle per scheduler at its 3 warps per scheduler): 6 cycles, i.e. 0.5 per cycle at 3 warps, 1 at 6")
BLACKWELL_ISSUE = ("148 SMs (ASSUMED: the B200's count; no B300 figure at hand), 4 schedulers per SM; clock 1.5 GHz "
                   "and 6 cycles between a warp's issues ASSUMED the H200's")

HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", 3.35e12, 67e12, 989e12, 80e9,
                     "NVIDIA H100 SXM datasheet (nvidia.com/en-us/data-center/h100): 3.35 TB/s HBM3, 67 TFLOP/s FP32, "
                     "989 TFLOP/s dense BF16 tensor, 80 GB",
                     132, 1.5e9, 6.0, 90, "132 SMs: NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5); "
                     "clock and issue rate ASSUMED the H200's (same SM): " + H200_ISSUE),
    "h200": Hardware("h200", 4.8e12, 67e12, 989e12, 141e9,
                     "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): 4.8 TB/s HBM3e, 141 GB; FP32 67 and "
                     "BF16 989 TFLOP/s (the datasheet's, same Hopper die as the H100)",
                     132, 1.5e9, 6.0, 90, H200_ISSUE),
    "b200": Hardware("b200", 8.0e12, 90e12, 2.25e15, 192e9,
                     "NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx): 8 TB/s HBM3e and 192 GB per "
                     "GPU, 36 PFLOP/s sparse FP16/BF16 per 8 GPUs (2.25 dense per GPU); FP32 90 TFLOP/s: FlashInfer's "
                     "speed-of-light table (github.com/flashinfer-ai/flashinfer benchmarks), as conf/hardware/b200",
                     148, 1.5e9, 6.0, 100, BLACKWELL_ISSUE),
    "b300": Hardware("b300", 8.0e12, 90e12, 2.25e15, 288e9,
                     "NVIDIA HGX B300 specifications (nvidia.com/en-us/data-center/hgx): 8 TB/s HBM3e and 288 GB per "
                     "GPU, as conf/hardware/b300.yaml; FP32 and dense BF16: no B300 figure at hand, the B200's "
                     "(ASSUMED: same SM count class)",
                     148, 1.5e9, 6.0, 100, BLACKWELL_ISSUE),
    "rtx4090": Hardware("rtx4090", 1.008e12, 82.6e12, 165.2e12, 24e9,
                        "NVIDIA Ada Lovelace architecture whitepaper (RTX 4090: 1008 GB/s GDDR6X, 82.6 TFLOP/s FP32, "
                        "165.2 TFLOP/s FP16 tensor with FP32 accumulate, dense; 24 GB)"),
}

# One kernel launch's floor under CUDA graphs (what the published decode numbers use: "CUDA graphs on").
# Source: the CUDA.jl documentation (cuda.juliagpu.org/dev/usage/graphs/): an MLP at batch 16 of eight tiny
# kernels (four mul! + four broadcasts) takes 16 us launched as one graph, i.e. 2 us per kernel including
# its own (negligible) work. Cross-check: pytorch/pytorch issue #161104 times a 1024-element add at 1.1-1.3 us.
# A GPU run replaces it with its own: launch_floor_from_csv(RUN_DIR / "launch_floor.csv").
LAUNCH_FLOOR_S = 2.0e-6
LAUNCH_FLOOR_SOURCE = ("CUDA.jl docs, cuda.juliagpu.org/dev/usage/graphs/ (8 small kernels in 16 us as one graph: "
                       "2 us per launch); pytorch/pytorch#161104 (1.1-1.3 us for a tiny add) as a cross-check")

# Kernel launches per layer per step, counted from this repo's launchers (the kernel-level rows time these):
#   mamba2  baseline_ar 1 (baselines/mamba2_ssu.py ssu_ar_kernel); replay_ar output_only 3 (replayssm/mamba2/
#           decode.py _launch_step: _bc_precompute_kernel + mamba2_ar_step_kernel + mamba2_ar_fold_kernel, whose
#           programs exit at once on the rows that do not flush), state_and_output 1;
#           baseline_spec 1 (ssu_spec_kernel); commit_replay_spec 2 (verify + commit); replay_spec 2
#           (replayssm/mamba2/spec_kernels.py _scatter_bc_kernel + _verify_kernel), its verify_fold form 3
#           (replayssm/mamba2/spec_verify_fold.py: prep + verify + fold)
#   gdn     baseline_ar 1 (baselines/gdn_recurrent.py); replay_ar 1 (replayssm/gdn/decode_kernels.py
#           _gdn_replay_step_kernel), its output_only_fold route 3 (replayssm/delta_rule/launch.py: prep + step +
#           fold); baseline_spec 1; commit_replay_spec 2 (baselines/gdn_commit_replay.py);
#           replay_spec 1 (replayssm/gdn/spec_kernels.py _spec_verify_kernel)
# plus CURSOR_LAUNCHES for the ReplaySSM methods: the cursor advance / commit kernel, one per layer when each
# layer owns its cursor (the kernel rows), one per model step when the layers share it (vLLM, whole-model rows).
LAUNCHES: dict[tuple[str, str, str], int] = {
    ("mamba2", "baseline_ar", ""): 1, ("mamba2", "replay_ar", "output_only"): 3,
    ("mamba2", "replay_ar", "state_and_output"): 1, ("mamba2", "baseline_spec", ""): 1,
    ("mamba2", "commit_replay_spec", ""): 2, ("mamba2", "replay_spec", ""): 2,
    ("mamba2", "replay_spec", "verify_fold"): 3,
    ("gdn", "baseline_ar", ""): 1, ("gdn", "replay_ar", ""): 1, ("gdn", "replay_ar", "output_only_fold"): 3,
    ("gdn", "baseline_spec", ""): 1, ("gdn", "commit_replay_spec", ""): 2, ("gdn", "replay_spec", ""): 1,
}
CURSOR_LAUNCHES = {"replay_ar": 1, "replay_spec": 1}
METHODS = ("baseline_ar", "replay_ar", "baseline_spec", "commit_replay_spec", "replay_spec")
REGIMES = ("bandwidth-bound", "compute-bound", "issue-bound", "latency-bound")


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step of one layer at `batch`: the four terms and their total. `issue_s` is 0 where the issue
    table has no entry for the point (`instructions` 0 too): the model is then bytes, FLOPs and launches only."""

    bytes_s: float
    flops_s: float
    launch_s: float
    bytes: float            # per step, whole batch
    flops: float
    launches: int
    issue_s: float = 0.0
    instructions: float = 0.0   # warp-instructions per step, whole batch

    @property
    def total(self) -> float:
        return max(self.bytes_s, self.flops_s, self.issue_s) + self.launch_s

    @property
    def regime(self) -> str:
        """The largest term: launches (latency-bound), instruction issue (issue-bound), FLOPs (compute-bound) or
        bytes (bandwidth-bound)."""
        work = max(self.bytes_s, self.flops_s, self.issue_s)
        if self.launch_s > work:
            return "latency-bound"
        if self.issue_s > max(self.bytes_s, self.flops_s):
            return "issue-bound"
        return "compute-bound" if self.flops_s > self.bytes_s else "bandwidth-bound"

    def __add__(self, other: StepTime) -> StepTime:
        return StepTime(self.bytes_s + other.bytes_s, self.flops_s + other.flops_s, self.launch_s + other.launch_s,
                        self.bytes + other.bytes, self.flops + other.flops, self.launches + other.launches,
                        self.issue_s + other.issue_s, self.instructions + other.instructions)


def hardware(name: str) -> Hardware:
    key = str(name).lower()
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)}")
    return HARDWARE[key]


def family_of(geom) -> str:
    if isinstance(geom, Mamba2Geometry):
        return "mamba2"
    if isinstance(geom, GDNGeometry):
        return "gdn"
    if isinstance(geom, KDAGeometry):
        return "kda"
    raise ValueError(f"expected a Mamba2Geometry, GDNGeometry or KDAGeometry, got {type(geom).__name__}")


def launches(family: str, method: str, route: str = "output_only", shared_cursor: bool = False) -> int:
    """Launches per layer step (LAUNCHES), with the cursor kernel unless the layers share one cursor."""
    family = "gdn" if family == "kda" else family          # KDA runs GDN's kernels (PER_CHANNEL)
    key = (family, method, route if (family, method) == ("mamba2", "replay_ar") else "")
    if (family, method, route) in LAUNCHES:                 # a route with its own launch count
        key = (family, method, route)
    if key not in LAUNCHES:
        raise ValueError(f"no launch count for {key}; known: {sorted(LAUNCHES)}")
    return LAUNCHES[key] + (0 if shared_cursor else CURSOR_LAUNCHES.get(method, 0))


def layer_traffic(geom, method: str, *, L: int = 16, route: str = "output_only", T: int = 4,
                  accepted: int | None = None, B_hist: int = 16, state_bytes: int = traffic.FP32,
                  act_bytes: int = traffic.HALF) -> traffic.Traffic:
    """Mean bytes and FLOPs per step of one layer and one sequence (replayssm.traffic). AR: the flush cycle's mean;
    spec: verify + commit at `accepted` tokens per step (default T: every draft accepted). `state_bytes` 1: an 8-bit
    state (int8 / fp8), its per-(slot, head) fp32 scales counted with every state read and write."""
    fam = family_of(geom)
    acc = T if accepted is None else accepted
    m = fam == "mamba2"
    fn = {name: getattr(traffic, f"{fam}_{name}") for name in ("baseline_ar", "baseline_spec", "commit_replay_spec",
                                                               "replay_spec")}
    if method == "baseline_ar":
        return fn["baseline_ar"](geom, state_bytes, act_bytes)
    if method == "replay_ar":
        if m:
            return traffic.mamba2_replay_ar_cycle(geom, L, route, state_bytes, act_bytes)
        return getattr(traffic, f"{fam}_replay_ar_cycle")(geom, L, state_bytes, act_bytes, route)
    if method == "baseline_spec":
        return fn["baseline_spec"](geom, T, state_bytes, act_bytes)
    if method == "commit_replay_spec":
        return fn["commit_replay_spec"](geom, T, acc, state_bytes, act_bytes)
    if method == "replay_spec":
        return fn["replay_spec"](geom, max(B_hist, T), T, acc, state_bytes, act_bytes)
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")


def step_time(geom, method: str, hw: Hardware | str, batch: int, *, launch_floor_s: float = LAUNCH_FLOOR_S,
              shared_cursor: bool = False, n_launches: int | None = None, issue: bool = True, **kw) -> StepTime:
    """Seconds of one step of one layer for `batch` sequences (inputs [batch, nheads, headdim] per token) on `hw`.
    `kw`: layer_traffic's L, route, T, accepted, B_hist, state_bytes, act_bytes. `n_launches` overrides the count
    (e.g. launches_from_csv of a GPU run). `issue=False` leaves the issue floor out (the bytes-FLOPs-launches
    model the published record used before it)."""
    hw = hardware(hw) if isinstance(hw, str) else hw
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    tr = layer_traffic(geom, method, **kw)
    n = launches(family_of(geom), method, kw.get("route", "output_only"), shared_cursor) if n_launches is None \
        else n_launches
    b, f = batch * tr.total, batch * tr.flops
    inst, issue_s = (step_issue(geom, method, hw, batch, **kw) if issue else None) or (0.0, 0.0)
    return StepTime(bytes_s=b / hw.hbm_Bps, flops_s=f / hw.simt_fp32_flops, launch_s=n * launch_floor_s,
                    bytes=b, flops=f, launches=n, issue_s=issue_s, instructions=inst)


def geometry_key(geom) -> str:
    """How issue_table names a geometry: its class and fields, e.g. "GDNGeometry(H=16, HV=64, K=128, V=128)"."""
    return repr(geom)


def issue_key(method: str, route: str = "output_only", L: int = 16, T: int = 4, B_hist: int = 16,
              state_bytes: int = traffic.FP32) -> tuple[str, str, int, int, int, int]:
    """(method, route, L, T, B_hist, state bytes) with the parameters the method's kernels do not compile in set
    to 0 (the AR baseline none; the replay AR step its buffer length and route; the spec kernels T and history,
    and the ring verify's form where it is not the shipped fused one: replayssm/checks.py SPEC_ROUTES)."""
    if method == "baseline_ar":
        return (method, "", 0, 0, 0, state_bytes)
    if method == "replay_ar":
        return (method, route, L, 0, 0, state_bytes)
    form = route if method == "replay_spec" and route == "verify_fold" else ""
    return (method, form, 0, T, B_hist, state_bytes)


def longest_path_share(method: str, L: int = 16, T: int = 4, accepted: int | None = None, B_hist: int = 16) -> float:
    """The share of a step's programs on their kernel's longest SASS path (the flush): the replay AR step's one
    flush in L steps; a ReplaySSM spec verify's rows that fold, accepted / B_hist of them in the ring's steady state;
    none for the other methods (every program on its shortest storing path)."""
    if method == "replay_ar":
        return 1.0 / L
    if method == "replay_spec":
        return min(1.0, (T if accepted is None else accepted) / max(1, B_hist))
    return 0.0


def step_issue(geom, method: str, hw: Hardware, batch: int, *, L: int = 16, route: str = "output_only",
               T: int = 4, accepted: int | None = None, B_hist: int = 16, state_bytes: int = traffic.FP32,
               act_bytes: int = traffic.HALF) -> tuple[float, float] | None:
    """(warp-instructions, seconds to issue them) of one step of one layer for `batch` rows, from the committed
    issue table (replayssm/issue_table.py); None where the table has no entry for this geometry, method, point
    and hw.arch. Each kernel issues at the rate its resident warps per SM allow (Hardware.issue_rate).

    Each kernel of the step costs warps x programs(batch) x instructions per warp. A kernel's program count is
    affine in the batch (the report captured its grid at two batches). The instructions per warp are its SASS
    paths: the replay AR step's cycle mean ((L - 1) normal steps on the shortest storing path, one flush on the
    longest), a ReplaySSM spec verify's flush rows (the longest path) at the ring's cadence, accepted / B_hist of
    the rows, the rest on the shortest; every other kernel on its shortest storing path."""
    from replayssm import issue_table

    if not hw.arch or not hw.warp_issue_cycles:
        return None
    key = (hw.arch, geometry_key(geom), *issue_key(method, route, L, T, B_hist, state_bytes))
    kernels = issue_table.STEPS.get(key)
    if kernels is None:
        return None
    w_max = longest_path_share(method, L, T, accepted, B_hist)
    total = seconds = 0.0
    for _, warps, warps_sm, per_row, fixed, path_min, path_max in kernels:
        n = warps * (per_row * batch + fixed) * ((1 - w_max) * path_min + w_max * path_max)
        total += n
        seconds += n / hw.issue_rate(warps_sm)
    return total, seconds


def speedup(geom, num: str, den: str, hw: Hardware | str, batch: int, **kw) -> float:
    """den's time / num's time at one point: a ReplaySSM-over-baseline speedup when num is the ReplaySSM method."""
    return step_time(geom, den, hw, batch, **kw).total / step_time(geom, num, hw, batch, **kw).total


def break_even_batch(geom, num: str, den: str, hw: Hardware | str, max_batch: int = 4096, **kw) -> int | None:
    """The smallest batch (powers of two up to max_batch, then refined) at which num is at least as fast as den;
    None when it never is."""
    b = 1
    while b <= max_batch and speedup(geom, num, den, hw, b, **kw) < 1.0:
        b *= 2
    if b > max_batch:
        return None
    lo = b // 2 + 1 if b > 1 else 1
    for x in range(lo, b + 1):
        if speedup(geom, num, den, hw, x, **kw) >= 1.0:
            return x
    return b


# ----------------------------------------------------------------------------------- a GPU run's own numbers

def _rows(path: Path | str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        return []
    with p.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("status", "ok") in ("ok", "")]


def launch_floor_from_csv(path: Path | str, mode: str = "graph") -> float | None:
    """The minimal kernel's median seconds per launch in experiments/launch_floor.py's launch_floor.csv (mode graph:
    CUDA-graph replay, what the published numbers use); None when the file or row is absent."""
    for r in _rows(path):
        if r.get("name") == "minimal" and r.get("mode") == mode and r.get("ms_median"):
            return float(r["ms_median"]) * 1e-3
    return None


def launches_from_csv(path: Path | str) -> dict[tuple[str, str, str], int]:
    """{(family, method, route): Triton launches per step} counted by launch_floor.py on that run."""
    out = {}
    for r in _rows(path):
        if r.get("method") and r.get("launches"):
            out[(r["family"], r["method"], r.get("route") or "")] = int(float(r["launches"]))
    return out
