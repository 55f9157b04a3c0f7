"""Commit-time replay for Kimi Delta Attention speculative decoding (FlashInfer style): GDN's baseline
(baselines/gdn_commit_replay.py) with the per-key-channel decay.

The checkpoint is frozen during verify (read once; the window runs serially in registers; no state write)
and the window is stashed (normalised k, raw v, g [K] per value head, beta); `spec_commit` replays the first
num_accepted stashed tokens into the checkpoint (one state read + one state write per step).

    cache = CommitReplayCache.allocate(geometry, num_slots, window)   # cache.state <- prefill state
    o = spec_verify(cache, q, k, v, g, beta)                          # g [batch, T, HV, K]
    spec_commit(cache, num_accepted)
Validation and dispatch are GDN's (run_spec_verify / run_spec_commit read the decay shape from the geometry).
Backends: "triton" (GDN's two kernels with PER_CHANNEL), "torch", "cpu" (GDN's C kernels, per-channel mode),
"ref" (float64).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from baselines.gdn_commit_replay import DeltaRuleCommitReplayCache, run_spec_commit, run_spec_verify
from replayssm.checks import check_cache_type
from replayssm.geometry import KDAGeometry


class CommitReplayCache(DeltaRuleCommitReplayCache):
    """Frozen KDA checkpoint + the last window's stash: `CommitReplayCache.allocate(KDAGeometry(...), num_slots,
    window, state_dtype, act_dtype, device, sr_seed)` (state formats: GDN's).

    state [num_slots, HV, V, K]; k [num_slots, H, T, K] (act); v [num_slots, HV, T, V] (act);
    g [num_slots, HV, T, K] fp32 (per key channel); beta [num_slots, HV, T] fp32.
    """

    GEOMETRY: ClassVar[type] = KDAGeometry


def spec_verify(cache: CommitReplayCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton") -> torch.Tensor:
    """Serial window from the frozen checkpoint (no state write); stash the window for the commit.

    q, k [batch, T, H, K]; v [batch, T, HV, V]; g [batch, T, HV, K], beta [batch, T, HV] fp32 -> o [batch, T, HV, V].
    """
    check_cache_type(cache, CommitReplayCache)
    return run_spec_verify(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend)


def spec_commit(cache: CommitReplayCache, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Replay the accepted prefix (num_accepted [batch] in 1..T, bonus included) into the checkpoint."""
    check_cache_type(cache, CommitReplayCache)
    run_spec_commit(cache, num_accepted, slots, backend)
