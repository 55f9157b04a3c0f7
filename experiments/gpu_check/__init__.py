"""GPU checks as one Python program: a lent GPU box's prepared call, as tables of time-boxed stages.

    python -m experiments.gpu_check --plan [--set kernel_check]     # the stages, their limits, the total
    python -m experiments.gpu_check --dry-run OUT_DIR                # every stage's CPU-safe form, here
    python -m experiments.gpu_check [--set S] OUT_DIR [--model M]    # on the GPU box (scripts/gpu/*.sh wrap this)

A GPU comes rarely, in 15-minute windows (one command at most 10 minutes, 8 files of 16 MiB back), so a call
is planned ahead as a stage set: each stage has a name, a time limit, its GPU commands and its dry-run
commands (`stages.py`). The runner (`runner.py`) runs every command as a subprocess in its own process group,
kills the group at the stage's limit (SIGTERM, then SIGKILL after a grace), records the stage in stages.tsv
and packs OUT_DIR after every stage, so a call killed later still returns what the finished stages wrote.

The sets (`--set`):
    gpu_check     first contact: env, wheels, launch floor, GPU tests, headline / e2e sweeps, DRAM counters,
                  report (scripts/gpu/gpu_check.sh)
    route_check   GDN / KDA replay_ar on both routes beside the baseline, ncu's DRAM bytes and sections
                  (scripts/gpu/route_check.sh)
    tune_check    experiments.tune on the AR kernels at --model, then the route sweep with that table
                  (scripts/gpu/tune_check.sh)
    kernel_check  the kernel-redesign issues' call: gate, tune both sides, the tuned kernel sweeps at the
                  headline points, ncu on the ReplaySSM steps, a table last (scripts/gpu/kernel_check.sh)

The GPU sweeps are named files, conf/sweep/gpu_*.yaml: the same file runs on the GPU and, through its
`on_cpu:` block, as the dry run's tiny sweep. The Python each stage needs is a module here, not a bash
heredoc: `provenance.py` (env.json, the wheel bundle's offline install), `programs.py` (the pytest gate with
its budget, the report programs, the kernel table), `tune_jobs.py` (experiments.tune split into parallel
jobs, their tables merged).

The runner imports only the standard library: on the GPU box it starts before the wheels stage has
installed Hydra. Stage programs import what they need in their own process.

Outputs (OUT_DIR, at most 8 files, refreshed after every stage): summary.txt, stages.tsv, env.json,
logs.tar.gz (every stage's log), results.tar.gz (the run directory, launch tables, ncu reports, pytest.xml,
launch_floor.json) and the set's loose files (tests.log, dram.csv, launch_floor.csv, kernel_table.md,
launch_table.json); while a stage runs also stage.log (its live log, gone once packed).

Environment (the wrappers pass it through): PY, WHEELS (a gpu_bundle.sh directory; `none`: no wheels
stage; default ./gpu_wheels where it exists), STAGES (a subset), T_<STAGE> (a stage's limit in seconds),
WORK (scratch dir), TESTED_STACK, GPU_TESTS / GATE_TESTS, PYTEST_ARGS, TEST_SELECT, LAUNCH_ARGS,
HEADLINE_ARGS / E2E_ARGS (extra Hydra overrides), DRAM_ARGS / NCU_ARGS, TUNE_JOBS.
"""
