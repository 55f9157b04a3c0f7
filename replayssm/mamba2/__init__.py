"""ReplaySSM for Mamba-2. Public API (DESIGN.md §2): ReplayCache, replay_step, materialize,
SpecRing, spec_verify, spec_commit, spec_reset."""

from replayssm.mamba2.cache import ReplayCache, SpecRing

__all__ = ["ReplayCache", "SpecRing"]
