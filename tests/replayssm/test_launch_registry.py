"""One declaration per kernel (replayssm/launch_registry.py): every launch config the kernels resolve at run time
is declared, under the key the declaration builds (the tuner's static key is the launch's own key, no second
copy), the methods' per-step kernels are what the steps launch, and an undeclared kernel is refused."""

from __future__ import annotations

import pytest
import torch

from experiments import tune
from replayssm import launch_registry, launch_table
from replayssm.checks import interpreter_active

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="runs the Triton kernels in the interpreter")

SMOKE = ["sweep=smoke", "sweep.on_cpu.backend=triton", "sweep.on_cpu.batch=[2]", "+sweep.on_cpu.buffer_len=[4]",
         "sweep.on_cpu.history_len=[8]", "progress=false"]


@pytest.mark.parametrize("model", ["tiny_mamba2", "tiny_gdn", "tiny_kda"])
@pytest.mark.parametrize("experiment", ["kernel_decode", "kernel_spec"])
def test_every_runtime_launch_is_declared_under_its_static_key(model, experiment):
    routes = "[output_only,state_and_output]" if model == "tiny_mamba2" else \
        "[output_only,state_and_output,output_only_fold]"
    spec_routes = "[fused,verify_fold]"
    ((plan, points),) = tune.plan_points([experiment], SMOKE + [f"sweep.models=[{model}]",
                                                               f"sweep.on_cpu.models=[{model}]",
                                                               f"sweep.routes={routes}",
                                                               f"+sweep.on_cpu.spec_routes={spec_routes}"],
                                         claims_only=False)
    assert points
    checked = set()
    for p in points:
        geometry = plan.models[p.model_key].geometry
        seen = {}
        for phase in tune.phases(p, plan, "cpu"):
            log, _ = tune.discover(phase)
            seen.update((x.kernel, x.key) for x in log)
        for kernel, key in seen.items():
            spec = launch_registry.spec(kernel)                     # declared
            assert spec.family in (p.family, "any"), (kernel, p.family)
            if spec.launched_by:
                static = launch_table.entry_key(tune.static_key(kernel, p, geometry), p.state_dtype)
                assert static == key, (kernel, static, key)        # the tuner's key is the launch's key
            checked.add(kernel)
        assert set(tune.kernels_of(p)) <= set(seen), (p.method, p.route, tune.kernels_of(p), sorted(seen))
    assert checked


def test_undeclared_kernels_and_missing_key_fields_are_refused():
    with pytest.raises(KeyError, match="no declaration in replayssm/launch_registry.py"):
        launch_table.resolve("gdn_replay_warp_specialized", {"K": 16}, torch.float32, 0, {"num_warps": 4})
    with pytest.raises(ValueError, match="no value for 'L'"):
        launch_registry.key("gdn_replay_ar", K=16, V=16, route="output_only")


def test_declarations_are_consistent():
    kernels = launch_registry.KERNELS
    for name, spec in kernels.items():
        assert name == spec.name and name.startswith((spec.family, "tree_")), name
        if spec.space is None:
            assert not spec.dropped, name                            # nothing to drop from
    # the KDA build of every shared kernel is declared apart, with the same key and space as GDN's
    for gdn, kda in launch_registry.KDA_BUILD.items():
        g, k = kernels[gdn], kernels[kda]
        assert g.key_fields == k.key_fields and g.space is k.space and g.launched_by == k.launched_by
    # per-step kernels per (method, family): one set per route where the route changes the kernels
    assert launch_registry.kernels_of("replay_ar", "gdn", "output_only") == ("gdn_replay_ar",)
    assert launch_registry.kernels_of("replay_ar", "gdn", "output_only_fold") == ("gdn_replay_ar_step",
                                                                                   "gdn_replay_ar_fold")
    assert launch_registry.kernels_of("replay_ar", "kda", "output_only") == ("kda_replay_ar",)


@pytest.mark.parametrize("module", ["replayssm.launch_registry", "replayssm.launch_table",
                                    "replayssm.mamba2.spec_tiles"])
def test_the_registry_imports_first_in_a_fresh_process(module):
    """Every launch function imports the registry, so it must import no kernel module at load time (a family
    package's __init__ imports its kernels): importing it first, alone, works."""
    import subprocess
    import sys

    code = f"import {module}; import replayssm.launch_registry as r; assert r.KERNELS"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
