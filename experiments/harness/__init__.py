"""The harness every experiment shares: config -> points -> checked, timed, recorded rows. It imports no
experiment (experiments/kernel, hybrid, vllm, accuracy sit above it) and this package file imports nothing:
import the module you need.

    entry.py       load_config (Hydra compose API), config_dict, hydra_entry, keep_user_overrides,
                   exit_if_nothing_measured: what every experiment's entry point shares
    points.py      validate a composed config and expand it into points (one row each); config schemas
    sweeps.py      the hybrid and accuracy sweep schemas, and which experiments read each conf/sweep file
    methods.py     the method registry (one entry per method, kernels imported lazily)
    workload.py    a family's random inputs, slot mapping and float64 oracle
    check.py       the correctness gate (status=wrong, never timed, when it fails)
    acceptance.py  speculative acceptance models (fixed, i.i.d. rate, per-position table)
    timing.py      CPU and GPU (CUDA graph, do_bench) timers, copy bandwidth, torch.compile
    bandwidth.py   the CPU copy-bandwidth probe that sizes cold stacks
    memory.py      peak memory, NVML, footprint, layer stacks for a cold L2, max concurrency
    env.py         provenance (env.json) and the hardware profile
    store.py       results/<hardware>/<run-id>/{rows.csv, env.json, config.yaml}, resume, failure()
    budget.py      the time budget of a run (deadline, claims-first order)

The kernel runner is experiments/kernel/run.py; the GPU sweep estimate is experiments/budget_estimate.py.
Notebook / test use, without the Hydra runtime:

    from experiments.harness.entry import load_config
    from experiments.kernel.run import run_experiment
    result = run_experiment(load_config("kernel_decode", ["sweep=cpu", "sweep.batch=[1]"]))
    result.rows, result.run_dir
"""
