"""ReplaySSM for Gated DeltaNet. Public API (README): ReplayCache, replay_step, materialize (AR decode);
SpecRing, spec_verify, spec_commit, spec_reset, spec_materialize (speculative decoding)."""

from replayssm.gdn.cache import ReplayCache
from replayssm.gdn.decode import materialize, replay_step
from replayssm.gdn.ring import SpecRing
from replayssm.gdn.spec import spec_commit, spec_materialize, spec_reset, spec_verify

__all__ = ["ReplayCache", "SpecRing", "materialize", "replay_step", "spec_commit", "spec_materialize", "spec_reset",
           "spec_verify"]
from replayssm.gdn.tree import tree_commit, tree_verify  # noqa: E402

__all__ += ["tree_commit", "tree_verify"]
