"""ReplaySSM for Mamba-2. Public API (README: Using the kernels): ReplayCache, replay_step, materialize (AR decode);
SpecRing, spec_verify, spec_commit, spec_reset, spec_materialize (speculative decoding)."""

from replayssm.mamba2.cache import ReplayCache, SpecRing
from replayssm.mamba2.decode import materialize, replay_step
from replayssm.mamba2.spec import spec_commit, spec_materialize, spec_reset, spec_verify

__all__ = ["ReplayCache", "SpecRing", "materialize", "replay_step", "spec_commit", "spec_materialize", "spec_reset",
           "spec_verify"]
from replayssm.mamba2.tree import tree_commit, tree_verify  # noqa: E402

__all__ += ["tree_commit", "tree_verify"]
