"""The Hydra entry points, run as a user runs them (a subprocess), and the launcher configs."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness_doubles import FAST

from experiments.harness.entry import load_config

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", module, *args, *FAST, f"out_dir={tmp_path / 'results'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _run_dirs(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "results" / "cpu").iterdir() if p.is_dir())


def test_multirun_over_models_writes_one_run_dir_and_nothing_in_cwd(tmp_path):
    proc = _run(tmp_path, "experiments.kernel_decode", "--multirun", "model=tiny_mamba2,tiny_gdn", "sweep=cpu",
                "sweep.batch=[1]", "sweep.buffer_len=[2]", "method=ours", f"hydra.sweep.dir={tmp_path / 'multirun'}",
                "hydra.sweep.subdir=${hydra.job.num}")
    (run,) = _run_dirs(tmp_path)                                    # two jobs, one run directory
    with open(run / "rows.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["status"] == "ok" for r in rows), rows
    assert {r["model"] for r in rows} == {"tiny_mamba2", "tiny_gdn"}   # model= narrowed the cpu sweep's models
    assert len({r["config_hash"] for r in rows}) == len(rows)
    for name in ("env.json", "config.yaml", "env.kernel_decode.json", "config.kernel_decode.yaml"):
        assert (run / name).exists(), name                          # each job's provenance, none overwritten
    assert (tmp_path / "multirun" / "0" / ".hydra" / "config.yaml").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multirun", "results"]      # nothing else in cwd
    assert "kernel_decode:" in proc.stdout and "status: ok=" in proc.stdout


def test_spec_entry_point_single_run(tmp_path):
    proc = _run(tmp_path, "experiments.kernel_spec", "sweep=cpu", "sweep.models=[tiny_mamba2]", "sweep.batch=[2]",
                "sweep.spec_T=[2]", "sweep.history_len=[4]", "method=replay", f"hydra.run.dir={tmp_path / 'h'}")
    (run,) = _run_dirs(tmp_path)
    with open(run / "rows.csv", newline="") as f:
        methods = {r["method"]: r["status"] for r in csv.DictReader(f)}
    assert methods == {"replay_spec": "ok", "baseline_ar": "ok"}       # the reference method rides along
    assert "kernel_spec:" in proc.stdout


def test_default_launcher_is_hydras_serial_basic_launcher():
    cfg = load_config("kernel_decode", return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("BasicLauncher")
    assert load_config("kernel_spec").experiment.name == "kernel_spec"
    assert load_config("kernel_decode").experiment.kind == "ar"


def test_slurm_launcher_composes_with_the_optional_plugin():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")             # the optional [slurm] extra
    cfg = load_config("kernel_decode", ["hydra/launcher=slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.gpus_per_node == 1
    assert launcher.submitit_folder.endswith("/.submitit/%j")


def test_accuracy_entry_writes_accuracy_csv_with_provenance(tmp_path):
    proc = _run(tmp_path, "experiments.accuracy", "sweep.models=[tiny_mamba2]", "sweep.steps=6", "sweep.checkpoints=2",
                "sweep.methods=[baseline_ar,replay_spec]", "sweep.workloads=[long_memory]",
                "sweep.state_dtype=[bfloat16]", "sweep.spec_T=2", "sweep.history_len=2",
                f"hydra.run.dir={tmp_path / 'outputs'}")
    (run,) = _run_dirs(tmp_path)
    with open(run / "accuracy.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["method"] for r in rows} == {"baseline_ar", "replay_spec"} and all(r["status"] == "ok" for r in rows)
    assert (run / "env.json").is_file() and (run / "config.yaml").is_file()
    assert "accuracy: " in proc.stdout and str(run) in proc.stdout
