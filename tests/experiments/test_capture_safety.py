"""Graph-capture safety checked without a GPU: which methods' timed steps make host syncs.

A CUDA graph cannot capture a step that reads a device value on the host (`.item()`, `nonzero`, a Python
branch on a tensor: aten._local_scalar_dense / aten.nonzero / aten.item). A TorchDispatchMode sees every
aten op of the step on the CPU, so it finds them here. The torch backends of the buffered methods read
their cursors on the host by design (data-dependent flushes), which is why experiments.harness.points
refuses timing_mode=graph with backend=torch; this test holds both ends of that: the baseline step is
sync-free, every other torch step syncs, and the refusal stands. (Under TRITON_INTERPRET=1 the
interpreter's own host copies hide the launchers' behaviour, so the Triton backend is not judged here.)
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from harness_doubles import compose
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.harness.methods import REGISTRY
from experiments.harness.points import expand
from experiments.harness.workload import Workload
from experiments.kernel.run import Stack

HOST_SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.item")
SYNC_FREE_TORCH = {"baseline_ar"}          # the torch steps that could be captured as they are


class HostSyncs(TorchDispatchMode):
    """Counts the aten ops that read a tensor's value on the host."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith(HOST_SYNC_OPS):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _points(tmp_path, experiment):
    cfg = compose(tmp_path, experiment, ["method=all", "sweep.routes=[state_and_output]", "sweep.backend=torch"])
    plan = expand(OmegaConf.to_container(cfg, resolve=True))
    return plan, [p for p in plan.points if not p.method.startswith("peer:")]


@pytest.mark.parametrize("experiment", ["kernel_decode", "kernel_spec"])
def test_torch_steps_host_syncs_are_what_the_graph_refusal_assumes(tmp_path, experiment):
    plan, pts = _points(tmp_path, experiment)
    seen = set()
    for p in pts:
        method = REGISTRY[p.method]
        wl = Workload(plan.models[p.model_key], p, "cpu", torch.Generator().manual_seed(int(p.config_hash()[:6], 16)))
        acc = plan.acceptances.get(p.acceptance) if p.acceptance else None
        stack = Stack(method, wl, p, acc, dict(plan.timing, max_layers=1), {"l2_bytes": None})
        cycle = stack.cycle(method.api(p.family))
        cycle()                                   # first call outside: lazy set-up is not the step
        mode = HostSyncs()
        with mode:
            cycle()
        syncs = sum(mode.ops.values())
        if p.method in SYNC_FREE_TORCH:
            assert syncs == 0, (p.family, p.method, dict(mode.ops))
        else:
            assert syncs > 0, (p.family, p.method, "sync-free now: lift the graph refusal for backend=torch")
        seen.add(p.method)
    assert seen >= ({"baseline_ar", "replay_ar"} if experiment == "kernel_decode" else
                    {"baseline_spec", "commit_replay_spec", "replay_spec"})


def test_graph_timing_with_the_torch_backend_is_refused(tmp_path):
    cfg = OmegaConf.to_container(compose(tmp_path, overrides=["sweep.timing_mode=auto"]), resolve=True)
    assert {p.timing_mode for p in expand(cfg).points} == {"eager"}      # auto on a CPU: eager
    cfg["sweep"]["timing_mode"] = "graph"
    with pytest.raises(ValueError, match="timing_mode"):
        expand(cfg)
