"""bf16 state across every cache and baseline: allocated as bf16 through the harness's method registry, and
refused with a clear ValueError (before any launch) where the Triton interpreter would compute on raw bits.
The numerics of bf16 state are covered by each method's own stream tests (torch / ref on CPU, Triton on GPU)."""

from __future__ import annotations

import pytest
import torch

from experiments.accuracy import Series, _point
from experiments.accuracy_series import few_heads, with_state_dtype
from experiments.harness.methods import REGISTRY
from experiments.harness.points import load_model_config, model_spec
from experiments.harness.workload import Workload
from replayssm.checks import interpreter_active

METHODS = ["baseline_ar", "replay_ar", "baseline_spec", "commit_replay_spec", "replay_spec"]
SWEEP = dict(rows=2, spec_T=2, history_len=4, acceptance="rate:0.7", backend="triton", device="cpu")


@pytest.mark.skipif(not interpreter_active(), reason="only the Triton interpreter refuses bf16")
@pytest.mark.parametrize("model", ["tiny_mamba2", "tiny_gdn"])
@pytest.mark.parametrize("name", METHODS)
def test_bf16_state_allocates_and_the_interpreter_refuses_it(model, name, gen):
    spec = few_heads(model_spec(load_model_config(model), None), 2)
    method = REGISTRY[name]
    s = Series(spec.key, "realistic", "float32", name, "bfloat16", 4 if method.uses_buffer else None,
               "output_only" if method.uses_buffer and spec.family == "mamba2" else None)
    p = _point(spec, s, SWEEP, 0)
    wl = with_state_dtype(Workload(spec, p, "cpu", gen), torch.bfloat16)
    cache = method.allocate(p, wl, 2, "cpu")
    state = cache if isinstance(cache, torch.Tensor) else cache.state
    assert state.dtype == torch.bfloat16
    method.set_state(cache, wl.random_state(2))
    before = state.clone()
    fns = method.api(spec.family)
    with pytest.raises(ValueError, match="bfloat16"):
        if method.kind == "ar":
            method.step(fns, cache, p, wl.call_kwargs(wl.inputs(2)), None, wl.out(2))
        else:
            method.verify(fns, cache, p, wl.call_kwargs(wl.inputs(2, window=2)), None, wl.out(2, window=2))
    assert torch.equal(state, before)                  # refused before any work
