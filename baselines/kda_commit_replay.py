"""Commit-time replay for Kimi Delta Attention speculative decoding (FlashInfer style): GDN's baseline
(baselines/gdn_commit_replay.py) with the per-key-channel decay.

The checkpoint is frozen during verify (read once; the window runs serially in registers; no state write)
and the window is stashed (normalised k, raw v, g [K] per value head, beta); `spec_commit` replays the first
num_accepted stashed tokens into the checkpoint (one state read + one state write per step).

    cache = CommitReplayCache.allocate(geometry, num_slots, window)   # cache.state <- prefill state
    o = spec_verify(cache, q, k, v, g, beta)                          # g [batch, T, HV, K]
    spec_commit(cache, num_accepted)
Backends: "triton" (GDN's two kernels with PER_CHANNEL), "torch", "ref" (float64); "cpu" raises ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from baselines import gdn_commit_replay as gdn
from replayssm.checks import NULL_SLOT, check_backend, check_pool_alloc, check_slots
from replayssm.gdn.spec import check_window
from replayssm.geometry import KDAGeometry
from replayssm.kda.decode import check_kda_backend
from replayssm.ring_cursors import check_live_counts
from replayssm.slot_pool import SlotPool


@dataclass
class CommitReplayCache(SlotPool):
    """Frozen checkpoint + the last window's stash.

    state [num_slots, HV, V, K]; k [num_slots, H, T, K] (act); v [num_slots, HV, T, V] (act);
    g [num_slots, HV, T, K] fp32 (per key channel); beta [num_slots, HV, T] fp32.
    """

    ACT_FIELD: ClassVar[str] = "k"

    geometry: KDAGeometry
    state: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    null_slot: int = NULL_SLOT

    @classmethod
    def allocate(cls, geometry: KDAGeometry, num_slots: int, window: int, state_dtype=torch.float32,
                 act_dtype=torch.float32, device="cpu") -> CommitReplayCache:
        check_pool_alloc(geometry, KDAGeometry, state_dtype, act_dtype, num_slots=num_slots, window=window)
        gm, n, T = geometry, num_slots, window
        return cls(geometry=gm,
                   state=torch.zeros(n, gm.HV, gm.V, gm.K, dtype=state_dtype, device=device),
                   k=torch.zeros(n, gm.H, T, gm.K, dtype=act_dtype, device=device),
                   v=torch.zeros(n, gm.HV, T, gm.V, dtype=act_dtype, device=device),
                   g=torch.zeros(n, gm.HV, T, gm.K, dtype=torch.float32, device=device),
                   beta=torch.zeros(n, gm.HV, T, dtype=torch.float32, device=device))

    @property
    def window(self) -> int:
        return self.k.shape[2]


def spec_verify(cache: CommitReplayCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton") -> torch.Tensor:
    """Serial window from the frozen checkpoint (no state write); stash the window for the commit.

    q, k [batch, T, H, K]; v [batch, T, HV, V]; g [batch, T, HV, K], beta [batch, T, HV] fp32 -> o [batch, T, HV, V].
    """
    gdn._check_cache(cache, CommitReplayCache)
    check_kda_backend(backend)
    batch, scale = check_window(cache.geometry, cache.window, cache.act_dtype, q, k, v, g, beta, out, scale, backend,
                                per_channel_g=True)
    check_backend(backend, cache.state)
    if q.device != cache.device:
        raise ValueError(f"inputs on {q.device}, cache on {cache.device}")
    if backend == "triton" and cache.geometry.K > gdn.MAX_K:
        raise ValueError(f"K={cache.geometry.K} > {gdn.MAX_K}: the kernel cannot tile a key dim this large")
    slots = check_slots(slots, batch, cache.num_slots, cache.device, cache.null_slot)
    gm = cache.geometry
    if out is None:
        out = torch.empty(batch, cache.window, gm.HV, gm.V, dtype=cache.act_dtype, device=cache.device)
    if batch:
        args = (cache, q, k, v, g, beta, scale, bool(use_qk_l2norm), slots, out)
        if backend == "triton":
            gdn._verify_triton(*args, per_channel=True)
        else:
            {"torch": gdn._verify_torch, "ref": gdn._verify_ref}[backend](*args)
    return out


def spec_commit(cache: CommitReplayCache, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Replay the accepted prefix (num_accepted [batch] in 1..T, bonus included) into the checkpoint."""
    gdn._check_cache(cache, CommitReplayCache)
    check_kda_backend(backend)
    check_backend(backend, cache.state)
    if not isinstance(num_accepted, torch.Tensor) or num_accepted.dim() != 1:
        raise ValueError("num_accepted must be a 1-D integer tensor [batch]")
    if num_accepted.device != cache.device:
        raise ValueError(f"num_accepted on {num_accepted.device}, cache on {cache.device}")
    batch = num_accepted.shape[0]
    slots = check_slots(slots, batch, cache.num_slots, cache.device, cache.null_slot)
    if batch == 0:
        return
    num_accepted = check_live_counts(num_accepted, slots, cache.null_slot, cache.window)
    if backend == "triton":
        gdn._commit_triton(cache, num_accepted, slots, per_channel=True)
    else:
        {"torch": gdn._commit_torch, "ref": gdn._commit_ref}[backend](cache, num_accepted, slots)
