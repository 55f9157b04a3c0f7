"""ReplaySSM for Kimi Delta Attention (KDA: the gated delta rule with a log decay per key channel). Public API,
one for one with replayssm.gdn: ReplayCache, replay_step, materialize (AR decode); SpecRing, spec_verify,
spec_commit, spec_reset, spec_materialize (speculative decoding); tree_verify, tree_commit (draft trees).
g is [batch, HV, K] per token and [batch, T, HV, K] per window; the state [slots, HV, V, K] is K-last."""

from replayssm.kda.cache import ReplayCache, SpecRing
from replayssm.kda.decode import materialize, replay_step
from replayssm.kda.spec import spec_commit, spec_materialize, spec_reset, spec_verify
from replayssm.kda.tree import tree_commit, tree_verify

__all__ = ["ReplayCache", "SpecRing", "materialize", "replay_step", "spec_commit", "spec_materialize", "spec_reset",
           "spec_verify", "tree_commit", "tree_verify"]
