"""The harness every experiment shares: config -> points -> checked, timed, recorded rows.

    points.py      validate a composed config and expand it into points (one row each); config schemas
    methods.py     the method registry (one entry per method, kernels imported lazily)
    workload.py    a family's random inputs, slot mapping and float64 oracle
    check.py       the correctness gate (status=wrong, never timed, when it fails)
    acceptance.py  speculative acceptance models (fixed, i.i.d. rate, per-position table)
    timing.py      CPU and GPU (CUDA graph, do_bench) timers, copy bandwidth, torch.compile
    memory.py      peak memory, NVML, footprint, layer stacks for a cold L2, max concurrency
    env.py         provenance (env.json) and the hardware profile
    store.py       results/<hardware>/<run-id>/{rows.csv, env.json, config.yaml}, resume
    runner.py      run_experiment(cfg): the plain function Hydra drives

Notebook / test use, without the Hydra runtime:

    from experiments.harness import load_config, run_experiment
    result = run_experiment(load_config("kernel_decode", ["sweep=cpu", "sweep.batch=[1]"]))
    result.rows, result.run_dir
"""

from experiments.harness.methods import REGISTRY, Method, register, unregister
from experiments.harness.points import Point, expand
from experiments.harness.runner import RunResult, load_config, run_experiment, summarize

__all__ = ["REGISTRY", "Method", "Point", "RunResult", "expand", "load_config", "register", "run_experiment",
           "summarize", "unregister"]
