"""experiments/gpu_check's runner and tables without a GPU: a stage that runs past its limit is killed with its
whole process group and recorded, the later stages still run, OUT is packed after every stage (a later stage
finds the earlier one's results there), a stage that stops short on purpose is no failure; the GPU sweep files
compose and expand to the points their stages name, on the GPU and through their on_cpu blocks; tune_jobs
splits the kernel sweeps into the jobs the plan counts; the kernel table pairs each ReplaySSM row with its
baseline and reads ncu's section reports. The whole dry run of a set: tests/report/test_gpu_check.py."""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path
from unittest import mock

import pytest
import torch

from experiments.gpu_check import programs, runner, stages, tune_jobs
from experiments.gpu_check.stages import Ctx, Stage, StageSet, py

ROOT = Path(__file__).resolve().parents[2]


def _stage(name: str, limit: int, code: str) -> Stage:
    steps = (py("-c", code),)
    return Stage(name, limit, f"test stage {name}", steps=steps, dry=steps)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"                                   # a zombie nobody reaped yet is dead


def test_a_stage_past_its_limit_is_killed_with_its_group_and_the_next_stages_run(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    pid_file = tmp_path / "grandchild.pid"
    first = (f"from pathlib import Path; d = Path({str(work)!r}) / 'results' / 'cpu' / 'rid'; "
             "d.mkdir(parents=True); (d / 'rows.csv').write_text('a,b\\n'); print('first done')")
    slow = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    # run after the kill: OUT already holds the first stage's results and the killed stage's record
    check = (f"import sys, tarfile; names = tarfile.open({str(out / 'results.tar.gz')!r}).getnames(); "
             f"tsv = open({str(out / 'stages.tsv')!r}).read(); "
             "sys.exit(0 if 'results/cpu/rid/rows.csv' in names and 'slow\\ttimeout' in tsv else 1)")
    short = "import os, sys; open(os.environ['GPU_CHECK_NOTE'], 'w').write('partial: test\\n'); sys.exit(10)"
    chosen = [_stage("first", 30, first), _stage("slow", 1, slow), _stage("check", 30, check),
              _stage("short", 30, short), _stage("bad", 30, "import sys; sys.exit(3)")]
    ctx = Ctx("test_set", out, work, sys.executable, "rid", dry=False, env={**os.environ, "STAGES": ""})
    rc = runner.Runner(StageSet("test_set", chosen, ("env.json",)), ctx).run()
    assert rc == 1                                                    # the timeout and the failure
    rows = [ln.split("\t") for ln in (out / "stages.tsv").read_text().splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("first", "ok"), ("slow", "timeout"), ("check", "ok"),
                                            ("short", "partial: test"), ("bad", "failed(rc=3)")]
    assert int(rows[1][2]) < 1 + stages.GRACE_S + 3                  # killed at its limit, not after 60 s
    assert not _alive(int(pid_file.read_text()))                      # its grandchild went with the group
    files = sorted(p.name for p in out.iterdir())
    assert files == ["logs.tar.gz", "results.tar.gz", "stages.tsv", "summary.txt"], files    # stage.log: packed
    with tarfile.open(out / "logs.tar.gz") as tar:
        logs = {n: tar.extractfile(n).read().decode() for n in tar.getnames() if n.endswith(".log")}
    assert set(logs) == {f"logs/{s.name}.log" for s in chosen} and "first done" in logs["logs/first.log"]
    summary = (out / "summary.txt").read_text()
    assert "test_set rid" in summary and ["slow", "timeout"] in [ln.split()[:2] for ln in summary.splitlines()]
    assert "FAILED: slow:timeout bad:failed(rc=3)" in capsys.readouterr().out


def test_a_dry_run_prints_a_gpu_only_stage_and_runs_a_cpu_form(tmp_path, capsys):
    gpu_only = Stage("gpu", 10, "gpu only", steps=(py("-c", "raise SystemExit(1)"),))
    cpu_form = Stage("both", 10, "a CPU form", steps=(py("-c", "raise SystemExit(1)"),),
                     dry=(py("-c", "print('cpu form ran')"),))
    ctx = Ctx("t", tmp_path / "out", tmp_path / "work", sys.executable, "rid", dry=True, env=dict(os.environ))
    assert runner.Runner(StageSet("t", [gpu_only, cpu_form], ()), ctx).run() == 0
    printed = capsys.readouterr().out
    assert "cpu form ran" in printed and "GPU commands skipped here" in printed
    assert f"[gpu] TRITON_INTERPRET=0 REPLAYSSM_TEST_DEVICE=cuda {sys.executable} -c raise SystemExit(1)" in printed
    assert "gpu\tskipped-gpu" in (tmp_path / "out" / "stages.tsv").read_text()


def test_every_set_fits_the_budget_and_its_stage_names_are_unique():
    ctx = Ctx("x", Path("o"), Path("w"), "python", "r", dry=False, env={})
    for stage_set in stages.SETS.values():
        names = [s.name for s in stage_set.stages]
        assert len(names) == len(set(names)) and stages.plan_total(stage_set.stages, ctx) <= stages.BUDGET_S
        assert len(stage_set.loose) + 5 <= 8          # + summary, stages.tsv, tests.log and the two tarballs
    assert stages.plan_total(stages.SETS["kernel_check"].stages, Ctx("x", Path("o"), Path("w"), "python", "r",
                                                                     dry=False, env={"T_TUNE": "200"})) > 480


# --------------------------------------------------------------------------------------- the sweep files

def _expand(experiment: str, over: list[str], cuda: bool):
    from experiments.harness.entry import config_dict, load_config
    from experiments.harness.points import expand

    cfg = config_dict(load_config(experiment, over))
    if not cuda:
        return expand(cfg)
    with mock.patch.object(torch.cuda, "is_available", return_value=True):
        return expand(cfg)


@pytest.mark.parametrize("experiment, name, methods, models, batches, per_point", [
    ("kernel_decode", "gpu_kernel_decode", "[baseline_ar,replay_ar]",
     {"qwen35_122b_a10b", "kimi_linear_48b_a3b", "nemotron3_super_120b"}, {256, 512}, {16}),
    ("kernel_spec", "gpu_kernel_spec", "[baseline_spec,replay_spec]",
     {"qwen35_122b_a10b", "kimi_linear_48b_a3b", "nemotron3_super_120b"}, {256, 512}, {4, 8}),
    ("kernel_decode", "gpu_headline_super", "[baseline_ar,replay_ar]", {"nemotron3_super_120b"}, {64, 256, 512},
     {8, 16}),
    ("kernel_decode", "gpu_headline_gdn", "[baseline_ar,replay_ar]", {"qwen35_122b_a10b", "kimi_linear_48b_a3b"},
     {64, 256, 512}, {16}),
    ("kernel_spec", "gpu_headline_spec4", "[baseline_spec,replay_spec,commit_replay_spec]",
     {"qwen35_122b_a10b", "kimi_linear_48b_a3b", "nemotron3_super_120b"}, {128, 512}, {4}),
    ("kernel_spec", "gpu_headline_spec6", "[replay_spec]", {"qwen35_122b_a10b", "nemotron3_super_120b"}, {128}, {6}),
    ("kernel_decode", "gpu_route", "[baseline_ar,replay_ar]", {"qwen35_122b_a10b", "kimi_linear_48b_a3b"},
     {256, 512}, {16}),
    ("kernel_decode", "gpu_tune_ar", "[baseline_ar,replay_ar]", {"qwen35_122b_a10b"}, {256}, {16}),
])
def test_each_gpu_sweep_expands_to_its_points_on_the_gpu_and_to_a_tiny_sweep_on_a_cpu(
        experiment, name, methods, models, batches, per_point):
    over = [f"sweep={name}", f"method.names={methods}"]
    plan = _expand(experiment, over, cuda=True)
    key = "buffer_len" if experiment == "kernel_decode" else "spec_T"
    assert {p.model for p in plan.points} == models and {p.batch for p in plan.points} == batches
    assert {getattr(p, key) for p in plan.points if getattr(p, key)} == per_point
    assert {(p.backend, p.device, p.timing_mode, p.l2, p.state_dtype, p.act_dtype) for p in plan.points} == {
        ("triton", "cuda", "graph", "cold", "float32", "bfloat16")}
    if name == "gpu_kernel_decode":   # the shipped default beside the redesign, which Mamba-2 does not have
        assert {p.route for p in plan.points if p.method == "replay_ar"} == {"output_only", "output_only_fold"}
        assert {p.route for p in plan.points if p.family == "mamba2" and p.method == "replay_ar"} == {"output_only"}
    elif experiment == "kernel_decode":
        assert {p.route for p in plan.points if p.method == "replay_ar"} == {"output_only", "state_and_output"}
    if name == "gpu_kernel_spec":     # both ring forms on Triton; the fused form keeps route None
        assert {p.route for p in plan.points if p.method == "replay_spec"} == {None, "verify_fold"}
    cpu = _expand(experiment, over, cuda=False)
    assert {p.model for p in cpu.points} <= {"tiny_mamba2", "tiny_gdn", "tiny_kda"} and {p.batch for p in cpu.points} \
        == {1} and {p.backend for p in cpu.points} == {"torch"} and len(cpu.points) <= 8


@pytest.mark.parametrize("experiment, name", [("e2e_decode", "gpu_e2e"), ("serving", "gpu_serving"),
                                              ("serving", "gpu_serving_spec")])
def test_the_hybrid_gpu_sweeps_compose_for_their_experiment(experiment, name):
    from experiments.harness.entry import config_dict, load_config
    from experiments.harness.sweeps import check_sweep

    check_sweep(experiment, name)
    sweep = config_dict(load_config(experiment, [f"sweep={name}"]))["sweep"]
    assert sweep["backend"] == "triton" and sweep["act_dtype"] == "bfloat16" and sweep["models"]


# ------------------------------------------------------------------------------------------- tune_jobs

def test_tune_jobs_split_both_sides_per_model_route_and_T():
    ar = tune_jobs.jobs_of("kernel_decode:gpu_kernel_decode:baseline_ar,replay_ar", [], dry=False)
    spec = tune_jobs.jobs_of("kernel_spec:gpu_kernel_spec:baseline_spec,replay_spec", [], dry=False)
    assert len(ar) == 8 and len(spec) == 18                      # the 26 jobs the kernel_check plan counts on
    assert {(j.method, j.route) for j in ar} == {("baseline_ar", "output_only"), ("replay_ar", "output_only"),
                                                 ("replay_ar", "output_only_fold")}
    assert not [j for j in ar if j.model == "nemotron3_super_120b" and j.route == "output_only_fold"]
    assert {(j.method, j.route) for j in spec} == {("baseline_spec", None), ("replay_spec", "fused"),
                                                   ("replay_spec", "verify_fold")}
    argv = next(j for j in spec if j.method == "replay_spec" and j.spec_T == 8 and j.route == "verify_fold").argv(
        Path("P"), 256, dry=False)
    assert argv[:6] == ["--experiment", "kernel_spec", "--all", "--geometry", "qwen35_122b_a10b", "--out"]
    assert argv[argv.index("--") + 1:] == ["sweep=gpu_kernel_spec", "sweep.batch=[256]", "method.names=[replay_spec]",
                                           "sweep.spec_routes=[verify_fold]", "sweep.spec_T=[8]",
                                           "experiment.reference_methods=[]"]
    assert [j.model for j in tune_jobs.jobs_of("kernel_decode:gpu_tune_ar:baseline_ar", ["m1", "m2"], False)] == [
        "m1", "m2"]
    dry = tune_jobs.jobs_of("kernel_decode:gpu_kernel_decode:baseline_ar", [], dry=True)
    assert [j.model for j in dry] == ["tiny_gdn"] and "--dry-run" in dry[0].argv(Path("P"), 256, dry=True)


# --------------------------------------------------------------------------------------- the kernel table

def _row(method, us, bytes_model, route="", cfg="h", source="tuned", **kw):
    base = {"experiment": "kernel_decode", "model": "m", "batch": "256", "spec_T": "", "acceptance": "",
            "buffer_len": "16" if method == "replay_ar" else "", "method": method, "route": route,
            "median_us": str(us), "bytes_model": str(bytes_model), "launch_source": source, "achieved_GBps": "3000",
            "status": "ok", "config_hash": cfg}
    return {**base, **kw}


def test_the_kernel_table_pairs_each_replay_row_with_its_baseline_and_the_default_config():
    rows = [_row("baseline_ar", 500, 2e9, cfg="b"), _row("baseline_ar", 520, 2e9, cfg="b-default", source="default"),
            _row("replay_ar", 400, 1e9, route="output_only", cfg="r"),
            _row("replay_ar", 600, 1e9, route="output_only", cfg="r-default", source="default"),
            _row("replay_ar", 0, 1e9, route="state_and_output", cfg="w", status="wrong")]
    table = programs.kernel_table(rows)
    assert len(table) == 4                                          # header, rule, two ok points
    assert table[3] == ("| kernel_decode | m | 256 | L=16 | replay_ar | output_only | 400.0 | 600.0 | tuned | 3000 "
                        "| 1.25x | 2.00x |")
    assert "| 500.0 | 520.0 | tuned |" in table[2]


def test_the_ncu_figures_of_a_section_report(tmp_path):
    src = ROOT / "results/h200/route-check-20261204T130226Z-feec103/ncu/dram-output_only-replay_ar-output_only.ncu.txt"
    (tmp_path / "ncu").mkdir()
    (tmp_path / "ncu" / src.name).write_text(src.read_text())
    (line,) = programs.ncu_figures(tmp_path)
    assert "_gdn_replay_step_kernel" in line and "Registers Per Thread 163 register/thread" in line
    assert "Theoretical Occupancy 18.75 %" in line and "Achieved Occupancy 18.15 %" in line


def test_concat_joins_the_per_route_dram_tables(tmp_path):
    (tmp_path / "a.csv").write_text("method,route\nbaseline_ar,\n")
    (tmp_path / "b.csv").write_text("method,route\nreplay_ar,state_and_output\n")
    args = type("A", (), {"work": tmp_path})
    assert programs.concat(args, "dram.csv", ["a.csv", "missing.csv", "b.csv"]) == 0
    assert (tmp_path / "dram.csv").read_text() == "method,route\nbaseline_ar,\nreplay_ar,state_and_output\n"


def test_the_spec_serving_sweep_runs_the_redesigned_ring_beside_native_spec():
    """spec_check's serving stage: b512 T4 at TP4 on an H200; replay_spec on the verify_fold form (sweep.spec_route),
    native spec without a form; off Triton the ring keeps its default form (route None)."""
    from omegaconf import OmegaConf

    from experiments.harness.entry import config_dict, load_config
    from experiments.hybrid.sweep import expand

    hw = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "hardware" / "h200.yaml"))
    cfg = config_dict(load_config("serving", ["sweep=gpu_serving_spec"]))
    with mock.patch.object(torch.cuda, "is_available", return_value=True):
        plan = expand(cfg, "serving", hw)
    assert {(p.model, p.tp, p.batch, p.spec_T) for p in plan.points} == {
        ("qwen35_122b_a10b", 4, 512, 4), ("nemotron3_super_120b", 4, 512, 4)} and not plan.over_capacity
    assert {(p.method, p.route) for p in plan.points} == {("baseline_spec", None), ("replay_spec", "verify_fold")}
    cpu = config_dict(load_config("serving", ["sweep=serving_cpu", "sweep.models=[tiny_gdn]", "sweep.batch=[1]",
                                              "sweep.spec_route=verify_fold"]))
    assert {p.route for p in expand(cpu, "serving").points} == {None}       # torch: one algebra, no form named
