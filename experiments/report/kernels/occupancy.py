"""Theoretical occupancy of a compiled kernel per SM, and its issue floor: what a GPU will do with it, on a CPU.

    warps_by_regs  = schedulers * floor(regs_per_sm / schedulers / (ceil(regs * 32 / 256) * 256))
    blocks         = min(floor(warps_by_regs / warps), floor(max_warps / warps), max_blocks,
                         floor(smem_per_sm / (smem + reserved)))        (0 if smem > smem_per_block)
    occupancy      = blocks * warps / max_warps

Registers are allocated per warp in units of 256 (8 per thread) from the register file of the warp's
scheduler (a quarter of the SM's 64K on sm_90 / sm_100); shared memory per block is the kernel's static plus
dynamic shared memory plus the 1 KB the CUDA runtime reserves per block. The formula reproduces the H200's ncu
occupancy sections: 163 registers / 4 warps -> 3 blocks (18.75 %), 72 -> 7 (43.75 %), 48 -> 10 (62.5 %)
(results/h200/route-check-20261204T130226Z-feec103/ncu). ncu's "Block Limit Shared Mem" is taken at the shared
memory carveout the driver picked for the launch (65.5 KB there); this module's is at the largest carveout, which
the driver grows into when shared memory would otherwise bind, so both give the same theoretical occupancy.

Issue floor: a step's warp-instructions over the rate the SMs issue them,

    t_issue = programs * warps * instructions per warp / (issues per cycle per scheduler * schedulers * SMs * clock)
    issues per cycle per scheduler = min(1, resident warps per scheduler / cycles between one warp's issues)

with each GPU's clock and interval in replayssm/step_time.py (HARDWARE: on the H200, 1.5 GHz and 6 cycles, ncu's own
reading of the GDN replay step, which at its 3 warps per scheduler issues 0.5 per cycle).
"""

from __future__ import annotations

from dataclasses import dataclass

from replayssm import step_time as st

KB = 1024


@dataclass(frozen=True)
class SMLimits:
    """Per-SM limits of one compute capability."""

    arch: int
    regs_per_sm: int
    max_regs_per_thread: int
    reg_alloc_unit: int          # registers per warp are allocated in multiples of this
    max_warps: int
    max_blocks: int
    smem_per_sm: int
    smem_per_block: int          # the most one block may use (opt-in)
    reserved_smem: int           # per block, reserved by the CUDA runtime
    schedulers: int
    source: str


PROGRAMMING_GUIDE = ("CUDA C++ Programming Guide, 'Compute Capabilities', Table 'Technical Specifications per Compute "
                     "Capability' (docs.nvidia.com/cuda/cuda-c-programming-guide/#features-and-technical-"
                     "specifications): 64K 32-bit registers, 255 per thread, 64 resident warps and 32 resident blocks "
                     "per SM, 228 KB shared memory per SM, 227 KB per block, 1 KB reserved per block (the guide's "
                     "shared-memory section for compute capability 8.x and later); register allocation unit 256 "
                     "per warp and 4 warp schedulers per SM: the CUDA occupancy calculator and the Hopper / Blackwell "
                     "tuning guides")
LIMITS: dict[int, SMLimits] = {
    90: SMLimits(90, 65536, 255, 256, 64, 32, 228 * KB, 227 * KB, KB, 4,
                 PROGRAMMING_GUIDE + " (compute capability 9.0)"),
    100: SMLimits(100, 65536, 255, 256, 64, 32, 228 * KB, 227 * KB, KB, 4,
                  PROGRAMMING_GUIDE + " (compute capability 10.0: the same per-SM limits as 9.0)"),
}
# The GPU whose issue rate and clock a target's rows use (replayssm/step_time.py HARDWARE): the measured H200 for
# sm_90, the B300 of the published record for sm_100.
TARGET_HARDWARE = {90: "h200", 100: "b300"}


@dataclass(frozen=True)
class Occupancy:
    blocks_regs: int
    blocks_warps: int
    blocks_smem: int
    blocks: int                  # resident blocks per SM: the least of the limits (and max_blocks)
    warps: int                   # resident warps per SM
    occupancy: float             # warps / max warps
    limiter: str                 # which limit binds: "registers", "warps", "shared", "blocks"


def occupancy(registers: int, num_warps: int, shared: int, arch: int) -> Occupancy:
    """Theoretical occupancy of a kernel with `registers` per thread, `num_warps` per block and `shared` bytes of
    static + dynamic shared memory per block (the reserved 1 KB is added here)."""
    lim = LIMITS[arch]
    if registers <= 0 or num_warps <= 0:
        raise ValueError(f"registers and num_warps must be positive, got {registers}, {num_warps}")
    per_warp = -(-registers * 32 // lim.reg_alloc_unit) * lim.reg_alloc_unit
    warps_regs = lim.schedulers * (lim.regs_per_sm // lim.schedulers // per_warp)
    by = {"registers": warps_regs // num_warps, "warps": lim.max_warps // num_warps, "blocks": lim.max_blocks,
          "shared": 0 if shared > lim.smem_per_block else lim.smem_per_sm // (shared + lim.reserved_smem)}
    blocks = min(by.values())
    limiter = next(k for k in ("registers", "shared", "warps", "blocks") if by[k] == blocks)
    warps = blocks * num_warps
    return Occupancy(by["registers"], by["warps"], by["shared"], blocks, warps, warps / lim.max_warps, limiter)


def issue_seconds(warp_instructions: float, hw: st.Hardware | str, warps_per_sm: int) -> float:
    """Seconds the SMs of `hw` need to issue `warp_instructions` of a kernel with `warps_per_sm` resident warps."""
    hw = st.hardware(hw) if isinstance(hw, str) else hw
    return warp_instructions / hw.issue_rate(warps_per_sm)


def block_shared(static_shared: int, dynamic_shared: int, arch: int) -> int:
    """Shared memory one block asks for, reserved part excluded: cuobjdump's SHARED of a Triton kernel is the 1 KB
    `.nv.reservedSmem` the runtime reserves (ncu: static 0, driver 1.02 KB), so only what exceeds it is static."""
    return max(0, static_shared - LIMITS[arch].reserved_smem) + max(0, dynamic_shared)
