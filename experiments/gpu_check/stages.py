"""The stage sets: each stage a name, a time limit, what it does, its GPU commands and its dry-run commands.

A command is built when its turn comes (`Step(ctx) -> Cmd`), so a sweep knows whether an earlier stage
already made the run directory (the first sweep creates it, the later ones join it with resume=). A stage
without dry-run commands is printed and recorded `skipped-gpu` by --dry-run. Only the standard library here:
this module is read before the wheels stage installs anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 480        # one device command is at most 10 minutes; 8 leave room for start-up and the transfers
GRACE_S = 5           # SIGTERM at the limit, SIGKILL this much later
PACK_S = 5            # packing after each stage (small tar / gzip of text files)


@dataclass
class Ctx:
    """What a command needs to know about the call it is part of."""

    set_name: str
    out: Path
    work: Path
    py: str
    run_id: str
    dry: bool
    wheels: Path | None = None
    models: list[str] = field(default_factory=list)
    env: dict = field(default_factory=lambda: dict(os.environ))

    @property
    def site(self) -> Path:
        return self.work / "site"

    def run_dir(self) -> Path | None:
        found = sorted(self.work.glob(f"results/*/{self.run_id}"))
        return found[0] if found else None

    def arg(self, name: str, default: str = "") -> list[str]:
        """An environment variable's words (HEADLINE_ARGS, DRAM_ARGS ...), split like bash's `read -a`."""
        return self.env.get(name, default).split()


@dataclass(frozen=True)
class Cmd:
    argv: list[str]
    env: dict = field(default_factory=dict)       # set on top of the stage environment


Step = Callable[[Ctx], Cmd]


@dataclass(frozen=True)
class Stage:
    name: str
    limit_s: int
    what: str
    steps: tuple[Step, ...]                        # GPU commands, in order; the stage stops at the first failure
    # CPU-safe commands (the same tuple as steps: the stage runs as it is on a CPU); None: printed, recorded
    # skipped-gpu; another tuple: a CPU form, the GPU commands printed beside it
    dry: tuple[Step, ...] | None = None
    dry_limit_s: int | None = None                 # a shared CPU box runs the CPU forms: a wider limit
    when: Callable[[Ctx], bool] = lambda ctx: True
    note: str = ""                                  # --plan's extra line (the tests a stage runs)

    def limit(self, ctx: Ctx) -> int:
        given = ctx.env.get(f"T_{self.name.upper()}")
        if given:
            return int(given)
        return self.dry_limit_s if ctx.dry and self.dry_limit_s else self.limit_s


def py(*argv: str, **env: str) -> Step:
    """`$PY argv...` with fixed arguments."""
    return lambda ctx: Cmd([ctx.py, *argv], dict(env))


def module(name: str, *argv: str, **env: str) -> Step:
    return py("-m", name, *argv, **env)


def sweep(experiment: str, name: str, *over: str, extra: str = "") -> Step:
    """experiments.<experiment> sweep=<name>: the first sweep of a call creates its run, the later ones join it.
    `extra` names an environment variable of further Hydra overrides (HEADLINE_ARGS)."""
    def step(ctx: Ctx) -> Cmd:
        d = ctx.run_dir()
        where = f"resume={d}" if d else f"run_id={ctx.run_id}"
        return Cmd([ctx.py, "-m", f"experiments.{experiment}", f"sweep={name}", f"out_dir={ctx.work / 'results'}",
                    where, "progress=false", f"hydra.run.dir={ctx.work / 'hydra' / experiment}", *over,
                    *(ctx.arg(extra) if extra else [])])
    return step


def program(sub: str, *argv: str) -> Step:
    """One of programs.py's subcommands, with the call's directories."""
    return lambda ctx: Cmd([ctx.py, "-m", "experiments.gpu_check.programs", sub, "--out", str(ctx.out),
                            "--work", str(ctx.work), "--run-id", ctx.run_id, *argv])



def dram(out: str, *argv: str, extra: str = "") -> Step:
    """scripts/kernels/dram_traffic.py (ncu's DRAM counters, optionally its section report) -> WORK/<out>;
    `extra` names an environment variable that replaces `argv` (DRAM_ARGS, NCU_ARGS)."""
    def step(ctx: Ctx) -> Cmd:
        (ctx.work / out).parent.mkdir(parents=True, exist_ok=True)      # dram_traffic opens --out as it is
        return Cmd([ctx.py, "scripts/kernels/dram_traffic.py", "--out", str(ctx.work / out),
                    *(ctx.arg(extra) if extra and ctx.env.get(extra) else argv)])
    return step


def tune(*job_sets: str) -> Step:
    """tune_jobs.py: experiments.tune split into parallel jobs (EXPERIMENT:SWEEP:METHODS each), merged into
    WORK/tables; --model narrows the sweeps' models (tune_check)."""
    def step(ctx: Ctx) -> Cmd:
        argv = [ctx.py, "-m", "experiments.gpu_check.tune_jobs", "--table", str(ctx.work / "tables"),
                "--logs", str(ctx.work / "logs" / "tune")]
        for js in job_sets:
            argv += ["--job-set", js]
        for m in ctx.models:
            argv += ["--model", m]
        # a dry run tunes under the interpreter (experiments.tune --dry-run refuses without it)
        return Cmd(argv + ["--dry-run"], {"TRITON_INTERPRET": "1"}) if ctx.dry else Cmd(argv)
    return step


# ------------------------------------------------------------------------------------ shared stages

SHORT_TIMING = ("timing.warmup_ms=10", "timing.rep_ms=40")    # short windows: the points fit with compiles
_ENV_STEPS = (py("-c", "import subprocess, sys\ntry:\n    subprocess.run(['nvidia-smi'])\n"
                       "except OSError:\n    print('nvidia-smi not available')"),
              lambda ctx: Cmd([ctx.py, "-m", "experiments.gpu_check.provenance", "env", str(ctx.work / "env.json")]))
ENV = Stage("env", 15, "nvidia-smi, NVML, versions, commit, measured device copy bandwidth -> env.json",
            steps=_ENV_STEPS, dry=_ENV_STEPS, dry_limit_s=60)
_WHEELS_STEPS = (lambda ctx: Cmd([ctx.py, "-m", "experiments.gpu_check.provenance", "wheels", str(ctx.wheels),
                                  str(ctx.site), *(["--dry"] if ctx.dry else [])]),)
WHEELS = Stage("wheels", 30, "offline install of WHEELS=DIR (manifest sha256 + size) + import check (with WHEELS)",
               steps=_WHEELS_STEPS, dry=_WHEELS_STEPS, dry_limit_s=90, when=lambda ctx: ctx.wheels is not None)


def tests_stage(name: str, limit: int, what: str, ids_env: str, ids: tuple[str, ...]) -> Stage:
    """`gpu`-marked tests in order, bounded by the stage's limit (programs.py tests: the per-test log
    OUT/tests.log; a session its budget stopped with no failure is `budget: N not started`, no failure)."""
    def step(ctx: Ctx) -> Cmd:
        chosen = ctx.env.get(ids_env, "").split() or list(ids)
        return Cmd([ctx.py, "-m", "experiments.gpu_check.programs", "tests", "--out", str(ctx.out),
                    "--work", str(ctx.work), "--run-id", ctx.run_id, "--", *chosen])
    return Stage(name, limit, what, steps=(step,), note=f"({name} stage: pytest -m gpu {' '.join(ids)})")


# The tests stage: `gpu`-marked tests (they need a CUDA device), cheapest first by the first contact's tests.log
# (bf16 ~1 s each; a production-geometry case 5-11 s; the harness graph timing 13 s). One parametrization of
# each production-geometry test: the rest add minutes of compiles (`make test-gpu-stack` builds every kernel
# AOT on a CPU). GPU_TESTS=... replaces the list; the kernel gate (GATE_TESTS) is the kernels' part of it.
GATE_TESTS = (
    "tests/replayssm/gdn/test_gdn_decode.py::test_bf16_on_gpu",
    "tests/replayssm/kda/test_kda_decode.py::test_bf16_on_gpu",
    "tests/baselines/test_gdn_recurrent.py::test_bf16_on_gpu",
    "tests/replayssm/mamba2/test_decode.py::test_cuda_bf16_and_fp32_parity",
    "tests/replayssm/mamba2/test_decode.py::test_cuda_graph_capture",
    "tests/replayssm/mamba2/test_spec.py::test_triton_bf16_matches_torch_on_gpu",
    "tests/replayssm/mamba2/test_spec_verify_fold.py::test_bf16_matches_torch_on_gpu",
    "tests/replayssm/gdn/test_gdn_spec.py::test_gpu_production_geometry[triton-act_dtype0-state_dtype0]",
    "tests/replayssm/gdn/test_gdn_spec.py::test_gpu_production_geometry[triton:verify_fold-act_dtype0-state_dtype0]",
    "tests/replayssm/kda/test_kda_spec.py::test_gpu_kimi_geometry[triton:verify_fold-act_dtype0-state_dtype0]",
    "tests/baselines/test_gdn_spec_baselines.py::test_gpu_production_geometry[native-act_dtype0-state_dtype0]",
    "tests/baselines/test_gdn_spec_baselines.py::test_gpu_production_geometry[commit_replay-act_dtype0-state_dtype0]",
)
GPU_TESTS = GATE_TESTS + ("tests/experiments/test_harness.py::test_gpu_graph_timing_on_tiny_models",)

# ------------------------------------------------------------------------------------------ gpu_check
# Limits from the first two H200 contacts (results/h200/gpu-check-*/stages.tsv): env 5-7 s, wheels 12-13, launch
# 31-32 of 35-45, tests cut by a 70 s budget (first) / 20 passed in 61 s (second), headline 59-72, e2e cut at
# 50 and 75 (its serving point), dram 24 (3 ncu runs), report 25-30 (plots cut once).
_HEADLINE = (
    sweep("kernel_decode", "gpu_headline_super", *SHORT_TIMING, "method=all", extra="HEADLINE_ARGS"),
    sweep("kernel_decode", "gpu_headline_gdn", *SHORT_TIMING, "method=all", extra="HEADLINE_ARGS"),
    sweep("kernel_spec", "gpu_headline_spec4", *SHORT_TIMING, "method.names=[baseline_spec,replay_spec,"
          "commit_replay_spec]", extra="HEADLINE_ARGS"),
    sweep("kernel_spec", "gpu_headline_spec6", *SHORT_TIMING, "method.names=[baseline_spec,replay_spec,"
          "commit_replay_spec]", extra="HEADLINE_ARGS"),
)
_REPORT = (program("report"),)
_DRAM = "--methods baseline_ar,replay_ar,replay_spec --batch 64 --buffer-len 8 --timeout 13".split()
GPU_CHECK = [
    ENV, WHEELS,
    Stage("launch", 40, "launch floor b1: minimal kernel + each method, graph/eager/host; 3.6 launcher builds",
          steps=(lambda ctx: Cmd([ctx.py, "-m", "experiments.launch_floor", "--out", str(ctx.work),
                                  *ctx.arg("LAUNCH_ARGS")]),),
          # CPU: the entries it would time, then the host mode of them on the tiny models (interpreter)
          dry=(module("experiments.launch_floor", "--plan"),
               lambda ctx: Cmd([ctx.py, "-m", "experiments.launch_floor", "--device", "cpu", "--jobs", "1", "--out",
                                str(ctx.work), *ctx.arg("LAUNCH_ARGS")], {"TRITON_INTERPRET": "1"})),
          dry_limit_s=240),
    tests_stage("tests", 60, "the cheapest GPU tests (bf16 Triton, graph capture, production shapes), per-test "
                "record", "GPU_TESTS", GPU_TESTS),
    Stage("headline", 85, "AR decode b64/256/512 Super-120B L8/16 + Qwen3.5-122B, Kimi-Linear L16 (both routes); "
          "spec T4 b128/512, T6 b128 (conf/sweep/gpu_headline_*.yaml)", steps=_HEADLINE, dry=_HEADLINE,
          dry_limit_s=300),
    Stage("e2e", 75, "e2e decode Nano-4B + Qwen3.5-4B b256; serving T4 Nano-4B b128 native + ReplaySSM "
          "(conf/sweep/gpu_e2e.yaml, gpu_serving.yaml)",
          steps=(sweep("e2e_decode", "gpu_e2e", *SHORT_TIMING, extra="E2E_ARGS"),
                 sweep("serving", "gpu_serving", *SHORT_TIMING, extra="E2E_ARGS")),
          # CPU: the e2e / serving CPU sweeps, one tiny model, one batch (hybrid sweeps have no on_cpu block)
          dry=(sweep("e2e_decode", "e2e_cpu", "sweep.models=[tiny_mamba2]", "sweep.batch=[1]", extra="E2E_ARGS"),
               sweep("serving", "serving_cpu", "sweep.models=[tiny_mamba2]", "sweep.batch=[1]", extra="E2E_ARGS")),
          dry_limit_s=240),
    Stage("dram", 45, "ncu DRAM bytes read/written: baseline_ar, replay_ar, replay_spec (b64, L8) vs the byte model",
          steps=(dram("dram.csv", *_DRAM, extra="DRAM_ARGS"),)),
    Stage("report", 40, "aggregate, tables, claims report on what ran; plots in the time left",
          steps=_REPORT, dry=_REPORT, dry_limit_s=150),
]

# ---------------------------------------------------------------------------------------- route_check
_SECTIONS = "SpeedOfLight,Occupancy,LaunchStats,WarpStateStats,MemoryWorkloadAnalysis,SchedulerStats"
_ROUTE_SWEEP = (sweep("kernel_decode", "gpu_route", *SHORT_TIMING, "method.names=[baseline_ar,replay_ar]"),)
ROUTE_CHECK = [
    ENV, WHEELS,
    Stage("sweep", 60, "kernel_decode Qwen3.5-122B + Kimi-Linear b256/512 L16: baseline_ar, replay_ar both routes "
          "(conf/sweep/gpu_route.yaml)", steps=_ROUTE_SWEEP, dry=_ROUTE_SWEEP, dry_limit_s=120),
    Stage("ncu", 200, "ncu at Qwen3.5-122B b256 L16: DRAM bytes vs the byte model and the section report of the "
          "step kernels, per route (baseline beside output_only)",
          steps=(dram("ncu/dram-output_only.csv", "--model", "qwen35_122b_a10b", "--batch", "256", "--buffer-len",
                      "16", "--route", "output_only", "--methods", "baseline_ar,replay_ar", "--timeout", "90",
                      "--sections", _SECTIONS),
                 dram("ncu/dram-state_and_output.csv", "--model", "qwen35_122b_a10b", "--batch", "256",
                      "--buffer-len", "16", "--route", "state_and_output", "--methods", "replay_ar", "--timeout",
                      "90", "--sections", _SECTIONS),
                 program("concat", "dram.csv", "ncu/dram-output_only.csv", "ncu/dram-state_and_output.csv"))),
]

# ----------------------------------------------------------------------------------------- tune_check
# tune-check-20261204T130932Z-f5b9170: one model's AR kernels (12 + 16 + 16 candidates) took 248 s serially, ~5 s
# a candidate (compiles); tune_jobs.py runs a job per (model, method, route) side by side.
_TUNE_AR = (tune("kernel_decode:gpu_tune_ar:baseline_ar,replay_ar"),)
_TUNED_ROUTE_SWEEP = (sweep("kernel_decode", "gpu_route", *SHORT_TIMING, "method.names=[baseline_ar,replay_ar]"),)
TUNE_CHECK = [
    ENV, WHEELS,
    Stage("tune", 300, "experiments.tune, AR kernels at --model (default Qwen3.5-122B), b256 L16: baseline_ar and "
          "replay_ar both routes, one job each, in parallel (conf/sweep/gpu_tune_ar.yaml)",
          steps=_TUNE_AR, dry=_TUNE_AR, dry_limit_s=120),
    Stage("sweep", 60, "kernel_decode with that table: Qwen3.5-122B + Kimi-Linear b256/512 L16 (gpu_route.yaml)",
          steps=_TUNED_ROUTE_SWEEP, dry=_TUNED_ROUTE_SWEEP, dry_limit_s=120),
]

# --------------------------------------------------------------------------------------- kernel_check
# The kernel-redesign issues' call: <= 480 s with the wheels. The tune is the long pole: 26 jobs (3 models x
# (baseline_ar, replay_ar output_only) + GDN and KDA's output_only_fold + 3 models x 2 T x (baseline_spec,
# replay_spec fused and verify_fold)), about 12-24 candidates each at ~5 s (compiles), side by side on the box's
# 16 cores with their timing windows serialized; a job cut by the limit leaves its kernels at their defaults
# (rows say launch_source=default).
_KERNEL_DECODE = (sweep("kernel_decode", "gpu_kernel_decode", *SHORT_TIMING, "method.names=[baseline_ar,replay_ar]"),)
_KERNEL_SPEC = (sweep("kernel_spec", "gpu_kernel_spec", *SHORT_TIMING, "method.names=[baseline_spec,replay_spec]"),)
_KERNEL_TUNE = (tune("kernel_decode:gpu_kernel_decode:baseline_ar,replay_ar",
                     "kernel_spec:gpu_kernel_spec:baseline_spec,replay_spec"),)
_TABLE = (program("table"),)
_NCU = ("--model", "qwen35_122b_a10b", "--batch", "256", "--buffer-len", "16", "--spec-T", "4", "--route",
        "output_only_fold", "--methods", "replay_ar,replay_spec", "--timeout", "25", "--kernel-regex",
        "step_kernel|verify_kernel", "--sections", _SECTIONS + ",InstructionStats")
KERNEL_CHECK = [
    ENV, WHEELS,
    tests_stage("gate", 45, "correctness on the GPU: the kernel tests (bf16, production geometry, graph capture)",
                "GATE_TESTS", GATE_TESTS),
    Stage("tune", 140, "experiments.tune both sides at b256: AR (L16, shipped and redesigned routes) and spec "
          "(T4/T8, both ring forms) kernels of Qwen3.5-122B, Kimi-Linear, Super-120B, one job per model x method "
          "(x route / T), in parallel",
          steps=_KERNEL_TUNE, dry=_KERNEL_TUNE, dry_limit_s=150),
    Stage("decode", 40, "kernel_decode tuned, b256/512 L16, the three models: baseline_ar, replay_ar output_only "
          "and output_only_fold (conf/sweep/gpu_kernel_decode.yaml)",
          steps=_KERNEL_DECODE, dry=_KERNEL_DECODE, dry_limit_s=120),
    Stage("spec", 65, "kernel_spec tuned, b256/512 T4/T8 (B 16, rate 0.8), the three models: baseline_spec, "
          "replay_spec fused and verify_fold (conf/sweep/gpu_kernel_spec.yaml)",
          steps=_KERNEL_SPEC, dry=_KERNEL_SPEC, dry_limit_s=120),
    Stage("ncu", 50, "ncu on the ReplaySSM steps (replay_ar output_only_fold, replay_spec T4) at Qwen3.5-122B b256: "
          "DRAM bytes and sections (occupancy, registers, instructions)",
          steps=(dram("dram.csv", *_NCU, extra="NCU_ARGS"),)),
    Stage("table", 5, "the kernel table: tuned us, default us, vs baseline, byte model, ncu -> kernel_table.md",
          steps=_TABLE, dry=_TABLE, dry_limit_s=60),
]


# ----------------------------------------------------------------------------------------- spec_check
# The ring-verify issue's call (issue 35): the spec GPU tests of both forms, the spec kernels tuned at T 4 (12 jobs,
# one wave), kernel_spec at the headline (both forms, native spec, commit-replay; b256/512, T4/T8, aligned and
# staggered cursors) and the whole-model serving step at b512 T4 (Qwen3.5-122B and Super-120B at TP4, native vs
# ReplaySSM's verify_fold). Plan 475 s of the 480.
SPEC_GATE_TESTS = (
    "tests/replayssm/gdn/test_gdn_spec.py::test_gpu_production_geometry",
    "tests/replayssm/kda/test_kda_spec.py::test_gpu_kimi_geometry",
    "tests/replayssm/mamba2/test_spec.py::test_triton_bf16_matches_torch_on_gpu",
    "tests/replayssm/mamba2/test_spec_verify_fold.py::test_bf16_matches_torch_on_gpu",
    "tests/replayssm/mamba2/test_tree_verify_fold.py",
    "tests/replayssm/gdn/test_gdn_tree_verify_fold.py",
    "tests/replayssm/kda/test_kda_tree_verify_fold.py",
    "tests/baselines/test_gdn_spec_baselines.py::test_gpu_production_geometry",
)
_SPEC_TUNE = (tune("kernel_spec:gpu_tune_spec:baseline_spec,replay_spec,commit_replay_spec"),)
_SPEC_SWEEP = (sweep("kernel_spec", "gpu_kernel_spec", *SHORT_TIMING,
                     "method.names=[baseline_spec,replay_spec,commit_replay_spec]"),)
_SERVING = (sweep("serving", "gpu_serving_spec", *SHORT_TIMING, extra="E2E_ARGS"),)
SPEC_CHECK = [
    ENV, WHEELS,
    tests_stage("gate", 45, "correctness on the GPU: the spec kernels of both forms (bf16, production geometry, "
                "trees)", "GATE_TESTS", SPEC_GATE_TESTS),
    Stage("tune", 120, "experiments.tune at b256 T4: baseline_spec, replay_spec fused and verify_fold, "
          "commit_replay_spec, Qwen3.5-122B, Kimi-Linear, Super-120B, in parallel (conf/sweep/gpu_tune_spec.yaml)",
          steps=_SPEC_TUNE, dry=_SPEC_TUNE, dry_limit_s=150),
    Stage("spec", 90, "kernel_spec tuned, b256/512 T4/T8 (B 16, rate 0.8), the three models: baseline_spec, "
          "replay_spec both forms, commit_replay_spec, aligned and staggered (conf/sweep/gpu_kernel_spec.yaml)",
          steps=_SPEC_SWEEP, dry=_SPEC_SWEEP, dry_limit_s=150),
    Stage("serving", 100, "serving b512 T4: Qwen3.5-122B and Super-120B at TP4, native vs ReplaySSM verify_fold, "
          "the SSM layers' share of the step (conf/sweep/gpu_serving_spec.yaml)", steps=_SERVING,
          dry=(sweep("serving", "serving_cpu", "sweep.models=[tiny_gdn]", "sweep.batch=[1]",
                     "sweep.modes=[native,replayssm]", extra="E2E_ARGS"),), dry_limit_s=240),
    Stage("table", 5, "the kernel table: tuned us, default us, vs baseline, byte model -> kernel_table.md",
          steps=_TABLE, dry=_TABLE, dry_limit_s=60),
]


@dataclass(frozen=True)
class StageSet:
    name: str
    stages: list[Stage]
    loose: tuple[str, ...]                  # WORK files copied to OUT as they are (the rest goes into tarballs)
    launch_tables: str | None = None        # REPLAYSSM_LAUNCH_TABLES for every stage ("{work}" is WORK)


SETS = {s.name: s for s in (
    # first contact times the default launch configs and reads no table (rows: launch_source=default)
    StageSet("gpu_check", GPU_CHECK, ("env.json", "dram.csv", "launch_floor.csv"), launch_tables="off"),
    StageSet("route_check", ROUTE_CHECK, ("env.json", "dram.csv")),
    StageSet("tune_check", TUNE_CHECK, ("env.json", "launch_table.json"), launch_tables="{work}/tables"),
    # the table's JSON travels in results.tar.gz (tables/): OUT holds 8 files with tests.log
    StageSet("kernel_check", KERNEL_CHECK, ("env.json", "dram.csv", "kernel_table.md"), launch_tables="{work}/tables"),
    StageSet("spec_check", SPEC_CHECK, ("env.json", "kernel_table.md"), launch_tables="{work}/tables"),
)}


def stages_of(stage_set: StageSet, env: dict) -> list[Stage]:
    """The set's stages, narrowed to STAGES (space-separated names) when given; an unknown name raises."""
    wanted = env.get("STAGES", "").split()
    names = [s.name for s in stage_set.stages]
    unknown = [s for s in wanted if s not in names]
    if unknown:
        raise KeyError(f"unknown stage {unknown[0]!r} of {stage_set.name}; its stages: {' '.join(names)}")
    return [s for s in stage_set.stages if not wanted or s.name in wanted]


def plan_total(stages: list[Stage], ctx: Ctx) -> int:
    """Seconds the stages may take: each its limit plus the kill grace and the packing."""
    return sum(s.limit(ctx) + GRACE_S + PACK_S for s in stages)
