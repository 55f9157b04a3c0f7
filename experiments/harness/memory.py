"""Memory per point: allocator peak, NVML device usage, analytic footprint, layer stacks, concurrency.

    peak_mem_bytes   torch.cuda.max_memory_allocated() over the point (reset before it); NaN on CPU
    NVML             device-wide used bytes (includes the CUDA context and other processes); pynvml may be
                     missing or fail (no driver): every NVMLError is caught and the reading is absent (None)
    footprint_bytes  persistent cache bytes per sequence per layer: cache.nbytes() / num_slots (states,
                     buffers, rings, cursors, scratch); replayssm.traffic.cache_footprint is its analytic twin
    max_concurrency  sequences whose SSM caches fit an HBM budget over all SSM layers of the model
"""

from __future__ import annotations

import math
import os

import torch


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: str) -> float:
    if device != "cuda":
        return math.nan
    torch.cuda.synchronize()
    return float(torch.cuda.max_memory_allocated())


def free_bytes(device: str) -> int | None:
    """Free device memory (cuda), or the memory the OS can hand out now (CPU: os.sysconf SC_AVPHYS_PAGES x
    page size; None where the libc does not say). The layer stack may use hbm_budget_frac of it."""
    if device != "cuda":
        try:
            return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            return None
    try:
        free, _total = torch.cuda.mem_get_info()
    except (AssertionError, RuntimeError):          # a GPU sweep expanded on a CPU box (the budget estimate)
        return None
    return int(free)


def nvml_used_bytes(index: int = 0) -> int | None:
    """Device-wide used memory from NVML, None when NVML is absent or fails."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            return int(info.used)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None


def footprint_per_sequence(cache_bytes: int, num_slots: int) -> float:
    """Persistent bytes one sequence holds in one layer."""
    return cache_bytes / num_slots


def max_concurrency(hbm_budget_bytes: float, footprint_bytes: float, ssm_layers: int) -> int:
    """How many sequences' SSM caches (footprint_bytes per layer, `ssm_layers` layers) fit the budget."""
    if footprint_bytes <= 0 or ssm_layers <= 0:
        raise ValueError(f"footprint ({footprint_bytes}) and ssm_layers ({ssm_layers}) must be positive")
    return int(hbm_budget_bytes // (footprint_bytes * ssm_layers))


def stack_layers(layer_bytes: int, *, l2: str, l2_bytes: int | None, l2_factor: float, max_layers: int,
                 budget_bytes: int | None, unreachable_one: bool = False) -> tuple[int, str]:
    """Layers in the timed stack, each with its own state pool, and a note.

    cold: enough layers that their working set is >= l2_factor x L2 (the state then streams from HBM), at
    most max_layers and within the memory budget. warm: one layer. Raises MemoryError when not even one
    layer fits the budget (recorded as status=oom). unreachable_one (the CPU path): when the cap keeps the
    stack below l2_factor x L2 anyway, time one layer rather than a capped stack that still sits in the
    cache (on a CPU every extra layer is Python dispatch time, and the row is cache-resident either way).
    """
    if budget_bytes is not None and layer_bytes > budget_bytes:
        raise MemoryError(f"one layer needs {layer_bytes / 2**30:.2f} GiB, budget {budget_bytes / 2**30:.2f} GiB")
    if l2 != "cold":
        return 1, ""
    if not l2_bytes:
        return max_layers, "L2 size unknown: max_layers used"
    want = max(1, math.ceil(l2_factor * l2_bytes / max(layer_bytes, 1)))
    layers = min(want, max_layers)
    if budget_bytes is not None:
        layers = min(layers, max(1, budget_bytes // max(layer_bytes, 1)))
    note = "" if layers >= want else (f"cold L2 not reached: {layers} layers x {layer_bytes} B < "
                                      f"{l2_factor} x L2 ({l2_bytes} B)")
    if note and unreachable_one:
        return 1, note + ": timed as 1 layer, cache-resident"
    return int(layers), note


def cache_resident(layers: int, layer_bytes: int, *, l2: str, l2_bytes: int | None, l2_factor: float) -> bool | None:
    """Whether the timed stack may sit in the last-level cache: warm policy, or a cold stack whose working
    set stayed below l2_factor x L2 (capped by max_layers or the memory budget). None: cache size unknown.
    Such a row measures cache bandwidth, not the DRAM/HBM traffic the byte model is about."""
    if l2 != "cold":
        return True
    if not l2_bytes:
        return None
    return bool(layers * layer_bytes < l2_factor * l2_bytes)
