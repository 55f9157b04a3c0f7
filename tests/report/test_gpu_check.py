"""The GPU checks (python -m experiments.gpu_check, wrapped by scripts/gpu/*.sh) on this CPU box: every set's
--plan fits the budget; kernel_check's whole dry run (every stage's CPU form, packed, at most 8 files);
gpu_check's --dry-run with a local FAKE bundle (no network): the env stage runs, the wheels stage verifies the
manifest, installs offline into WORK/site and imports every harness module, a cp312 binary is only checked, the
GPU stages are printed as skipped; a tampered bundle fails the wheels stage. The per-test log plugin, the tests
stage's budget and the ncu CSV parser. The runner itself (kills, packing):
tests/experiments/test_gpu_check_runner.py."""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from experiments.report.kernels import dram as dram_traffic

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "gpu_check.sh"
SETS = {"gpu_check": ["env", "wheels", "launch", "tests", "headline", "e2e", "dram", "report"],
        "route_check": ["env", "wheels", "sweep", "ncu"],
        "tune_check": ["env", "wheels", "tune", "sweep"],
        "kernel_check": ["env", "wheels", "gate", "tune", "decode", "spec", "ncu", "table"],
        "spec_check": ["env", "wheels", "gate", "tune", "spec", "serving", "table"]}


def _wheel(directory: Path, dist: str, version: str, tag: str, module: str, body: str) -> Path:
    """A minimal valid wheel (module + dist-info with METADATA, WHEEL, RECORD)."""
    path = directory / f"{dist}-{version}-{tag}.whl"
    info = f"{dist}-{version}.dist-info"
    files = {f"{module}.py": body,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    pure = _wheel(bundle, "replayssm_fake_dep", "0.1", "py3-none-any", "replayssm_fake_dep", "VALUE = 42\n")
    binary = _wheel(bundle, "replayssm_fake_ext", "0.1", "cp312-cp312-manylinux_2_17_x86_64", "replayssm_fake_ext",
                    "VALUE = 1\n")
    lines = ["# fake bundle", "name\tversion\tsha256\tsize\tfile"]
    for whl in (pure, binary):
        data = whl.read_bytes()
        lines.append(f"{whl.name.split('-')[0]}\t0.1\t{hashlib.sha256(data).hexdigest()}\t{len(data)}\t{whl.name}")
    (bundle / "MANIFEST.tsv").write_text("\n".join(lines) + "\n")
    return bundle


def _run(out: Path, bundle: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PY=sys.executable, WHEELS=str(bundle), STAGES="env wheels tests", T_ENV="60",
               T_WHEELS="120", WORK=str(out.parent / "work"))
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.skipif(sys.version_info[:2] == (3, 12), reason="the fake cp312 wheel would be installable here")
def test_dry_run_installs_the_bundle_offline_and_prints_the_gpu_commands(tmp_path):
    out = tmp_path / "out"
    proc = _run(out, _bundle(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    stages = dict(line.split("\t")[:2] for line in (out / "stages.tsv").read_text().splitlines()[1:])
    assert stages == {"env": "ok", "wheels": "ok", "tests": "skipped-gpu"}
    assert (out / "env.json").is_file()
    site = out.parent / "work" / "site"
    assert (site / "replayssm_fake_dep.py").is_file()                       # the pure wheel: installed
    assert not (site / "replayssm_fake_ext.py").exists()                    # the cp312 binary: checked only
    assert "checked only (cp312 binary" in proc.stdout and "harness modules import" in proc.stdout
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and "summary.txt" in files and "logs.tar.gz" in files, files
    assert "GPU commands skipped here" in proc.stdout and "REPLAYSSM_TEST_DEVICE=cuda" in proc.stdout


def test_the_kernel_check_dry_run_runs_every_stage_on_the_cpu_and_packs_it(tmp_path):
    """kernel_check's whole dry run (about 40 s on 2 cores): the env stage, one tune job of each set under the
    interpreter merged into one table, the tuned sweeps' on_cpu forms into one run directory, the table last; the
    gate and ncu printed; OUT holds at most 8 files, among them the table and the packed run."""
    import json
    import tarfile

    out = tmp_path / "out"
    env = dict(os.environ, PY=sys.executable, WHEELS="none", WORK=str(tmp_path / "work"))
    env.pop("STAGES", None)
    proc = subprocess.run([sys.executable, "-m", "experiments.gpu_check", "--set", "kernel_check", "--dry-run",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    stages = dict(line.split("\t")[:2] for line in (out / "stages.tsv").read_text().splitlines()[1:])
    assert stages == {"env": "ok", "gate": "skipped-gpu", "tune": "ok", "decode": "ok", "spec": "ok",
                      "ncu": "skipped-gpu", "table": "ok"}, stages
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"summary.txt", "kernel_table.md", "results.tar.gz", "logs.tar.gz", "env.json"} <= set(
        files), files
    with tarfile.open(out / "results.tar.gz") as tar:
        names = tar.getnames()
        table = json.load(tar.extractfile("tables/interpreter.json"))
    assert any(n.endswith("/rows.csv") for n in names), names
    assert {"gdn_recurrent", "gdn_spec_verify"} <= set(table["entries"]) and "side by side" in table["tune_jobs"]
    text = (out / "kernel_table.md").read_text()
    assert "| kernel_decode | tiny_gdn | 1 | L=16 | replay_ar | output_only |" in text, text
    assert "| kernel_spec | tiny_gdn | 1 | T=4 | replay_spec |" in text and "x |" in text
    assert "GPU commands skipped here" in proc.stdout and "dram_traffic.py" in proc.stdout
    assert json.loads((out / "env.json").read_text())["git"]["git_commit"]


def test_a_tampered_bundle_fails_the_wheels_stage(tmp_path):
    bundle = _bundle(tmp_path)
    whl = next(bundle.glob("replayssm_fake_dep-*.whl"))
    whl.write_bytes(whl.read_bytes() + b"\0")                                # size and sha256 now differ
    out = tmp_path / "out"
    proc = _run(out, bundle)
    assert proc.returncode == 1
    assert "wheels\tfailed" in (out / "stages.tsv").read_text()
    assert "size/sha256 differ" in proc.stdout and not (out.parent / "work" / "site").exists()


def test_usage_error_without_out_dir():
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr


def _plan(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.gpu_check", "--plan", *args], cwd=ROOT,
                          env=dict(os.environ, **env), capture_output=True, text=True, timeout=30)


def _plan_rows(stdout: str) -> list[list[str]]:
    return [ln.split() for ln in stdout.splitlines()[1:] if not ln.startswith(("total", "("))]


@pytest.mark.parametrize("name", list(SETS))
def test_the_plan_of_every_set_lists_its_stages_within_eight_minutes(name):
    proc = _plan("--set", name)
    assert proc.returncode == 0, proc.stderr
    rows = _plan_rows(proc.stdout)
    assert [r[0] for r in rows] == SETS[name]
    total = int(proc.stdout.strip().splitlines()[-1].removeprefix("total: ").removesuffix(" s"))
    assert total == sum(int(r[1]) + 10 for r in rows) <= 480    # the limits plus kill grace and packing per stage


def test_the_wrappers_run_their_set():
    for script, name in (("gpu_check.sh", "gpu_check"), ("route_check.sh", "route_check"),
                         ("tune_check.sh", "tune_check"), ("kernel_check.sh", "kernel_check"),
                         ("spec_check.sh", "spec_check")):
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / script), "--plan"], cwd=ROOT,
                              env=dict(os.environ, PY=sys.executable), capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and [r[0] for r in _plan_rows(proc.stdout)] == SETS[name], proc.stderr
        text = (ROOT / "scripts" / "gpu" / script).read_text()
        assert len(text.splitlines()) <= 20 and "<<" not in text           # a wrapper: no heredoc, no stages


def test_a_missing_harness_module_fails_the_wheels_stage_naming_full(tmp_path):
    out = tmp_path / "out"
    bundle = _bundle(tmp_path)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "einops.py").write_text("raise ImportError('hidden by the test')\n")   # shadows the installed one
    env = dict(os.environ, PY=sys.executable, WHEELS=str(bundle), STAGES="wheels", T_WHEELS="120",
               WORK=str(tmp_path / "work"), PYTHONPATH=str(hide))
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 1
    assert "einops" in proc.stdout and "--full" in proc.stdout


def test_the_per_test_log_records_each_test_and_the_time_budget(tmp_path):
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_x.py").write_text("import time\n\ndef test_a():\n    time.sleep(0.3)\n\n"
                                     "def test_b():\n    assert False\n\ndef test_c():\n    pass\n")
    log = tmp_path / "tests.log"
    env = dict(os.environ, GPU_CHECK_TEST_LOG=str(log), GPU_CHECK_TEST_BUDGET_S="0.2",
               PYTHONPATH=str(ROOT / "scripts" / "gpu"))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(tests), "-p", "gpu_check_testlog", "-p", "no:randomly",
                           "-o", "addopts=", "-q", "--rootdir", str(tests)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = log.read_text().splitlines()
    assert lines[0].endswith("test_a\tstarted") and "test_a\tpassed" in lines[1], lines
    assert lines[-1].startswith("# time budget 0.2 s spent: 2 tests not started"), (lines, proc.stdout[-800:])
    assert proc.returncode == 10, proc.stdout[-800:]     # the budget stopped it, nothing ran that failed
    (tests / "test_x.py").write_text("def test_a():\n    assert False\n\ndef test_b():\n    pass\n")
    env["GPU_CHECK_TEST_BUDGET_S"] = "0"
    proc = subprocess.run([sys.executable, "-m", "pytest", str(tests), "-p", "gpu_check_testlog", "-p", "no:randomly",
                           "-o", "addopts=", "-q", "--rootdir", str(tests)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-800:]      # a failure before the budget ran out stays a failure


def _plan_tests() -> list[str]:
    line = next(ln for ln in _plan().stdout.splitlines() if ln.startswith("(tests stage: pytest -m gpu "))
    return line.removeprefix("(tests stage: pytest -m gpu ").removesuffix(")").split()


def test_the_tests_stage_runs_named_gpu_tests_that_exist():
    """Every node id of the tests stage collects and is `gpu`-marked (needs a CUDA device): a renamed test or a
    CPU-interpreter one in the list fails here, not on the GPU box."""
    ids = _plan_tests()
    assert ids and all("::" in i for i in ids), ids
    gate = next(ln for ln in _plan("--set", "kernel_check").stdout.splitlines() if ln.startswith("(gate stage:"))
    assert set(gate.removeprefix("(gate stage: pytest -m gpu ").removesuffix(")").split()) <= set(ids)
    env = dict(os.environ, TRITON_INTERPRET="0")
    counts = []
    for marker in ([], ["-m", "gpu"]):
        proc = subprocess.run([sys.executable, "-m", "pytest", *ids, *marker, "--collect-only", "-q", "-p",
                               "no:randomly"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        counts.append(int(proc.stdout.strip().splitlines()[-1].split()[0].split("/")[0]))
    assert counts[0] == counts[1] >= len(ids), counts


def test_a_tests_stage_cut_by_its_budget_says_so_and_is_no_failure(tmp_path):
    """The first H200 contact recorded `failed(rc=2)` for a tests stage that failed nothing (its budget ran out):
    now the stage says how many tests did not start, and the run does not fail for it."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_y.py").write_text("import time\n\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_a():\n"
                                     "    time.sleep(5.5)\n\n\n@pytest.mark.gpu\ndef test_b():\n    pass\n\n\n"
                                     "@pytest.mark.gpu\ndef test_c():\n    pass\n")
    out = tmp_path / "out"
    env = dict(os.environ, PY=sys.executable, STAGES="tests", T_TESTS="20", GPU_TESTS=str(tests / "test_y.py"),
               PYTEST_ARGS="-q -o addopts= -p no:warnings", WORK=str(tmp_path / "work"))
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    stages = dict(line.split("\t")[:2] for line in (out / "stages.tsv").read_text().splitlines()[1:])
    # budget 5 s from the stage's start: test_a starts and runs past it (a slow start may leave all 3 unstarted)
    assert stages in ({"tests": "budget: 2 not started"}, {"tests": "budget: 3 not started"}), (stages, proc.stdout)
    assert proc.returncode == 0 and "all stages passed" in proc.stdout, proc.stdout[-2000:]


def test_ncu_csv_is_summed_per_metric_and_a_missing_ncu_is_reported(tmp_path, monkeypatch):
    text = "\n".join(['==PROF== Connected', '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"',
                      '"0","k1","dram__bytes_read.sum","Mbyte","1.5"',
                      '"0","k1","dram__bytes_write.sum","Kbyte","2"',
                      '"1","k2","dram__bytes_read.sum","byte","1,000"',
                      '"1","k2","dram__bytes_write.sum","byte","0"'])
    assert dram_traffic.parse_ncu_csv(text) == (2, 1.5e6 + 1000, 2e3)
    monkeypatch.setattr(dram_traffic.shutil, "which", lambda name: None)
    out = tmp_path / "dram.csv"
    assert dram_traffic.main(["--out", str(out), "--methods", "baseline_ar,replay_ar"]) == 0
    text = out.read_text()
    assert text.count("unavailable") == 2 and "ncu not found" in text


def test_each_dram_point_is_a_valid_gpu_config():
    """The ncu stage's points compose and expand as on the GPU (CUDA only pretended; nothing runs)."""
    from unittest import mock

    import torch

    args = argparse.Namespace(model="nemotron3_super_120b", batch=256, buffer_len=16, spec_T=4, route="output_only")
    with mock.patch.object(torch.cuda, "is_available", return_value=True):
        for method in dram_traffic.AR_METHODS + dram_traffic.SPEC_METHODS:
            _, p = dram_traffic._point(args, method)
            assert p.method == method and p.batch == 256 and p.device == "cuda" and p.backend == "triton"


def test_plan_lists_the_launch_stage_after_the_wheels_and_a_subset_plans_alone():
    rows = {r[0]: r for r in _plan_rows(_plan().stdout)}
    assert int(rows["launch"][1]) > 0 and "launch floor" in " ".join(rows["launch"])
    proc = _plan(STAGES="launch", T_LAUNCH="50")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("total: 60 s"), proc.stdout
    proc = _plan(STAGES="launch nope")
    assert proc.returncode == 2 and "unknown stage 'nope'" in proc.stderr


def _dry_launch(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    env = dict(os.environ, PY=sys.executable, STAGES="env launch", T_ENV="120", T_LAUNCH="240",
               WORK=str(tmp_path / "work"), LAUNCH_ARGS="--only minimal --only gdn/baseline_ar")
    env.update(extra)
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=400)
    return proc, out


def test_dry_run_plans_the_launch_floor_and_times_it_on_the_cpu(tmp_path):
    """The launch stage on a CPU: --plan of every entry, then the host mode of the chosen ones under the
    interpreter -> launch_floor.csv in OUT, launch_floor.json in results.tar.gz; the GPU command is printed."""
    import csv
    import json
    import tarfile

    proc, out = _dry_launch(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    stages = dict(line.split("\t")[:2] for line in (out / "stages.tsv").read_text().splitlines()[1:])
    assert stages == {"env": "ok", "launch": "ok"}
    assert "gdn/peer:fla" in proc.stdout and "18 entries" in proc.stdout          # the plan: every entry
    with open(out / "launch_floor.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["name"], r["mode"], r["status"]) for r in rows] == [("minimal", "host", "ok"),
                                                                   ("gdn/baseline_ar", "host", "ok")]
    assert all(float(r["ms_median"]) > 0 and int(r["launches"]) >= 1 for r in rows)
    with tarfile.open(out / "results.tar.gz") as tar:
        meta = json.load(tar.extractfile("launch_floor.json"))
    assert meta["device"] == "cpu" and len(meta["rows"]) == 2 and "launcher_builds" in meta
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and "launch_floor.csv" in files and "stage.log" not in files, files
    assert "[launch] " in proc.stdout and "experiments.launch_floor --out" in proc.stdout     # the GPU command, said
    assert "launch floor (ms per call" in proc.stdout


def test_the_env_stage_says_whether_the_box_has_the_tested_torch_triton_pair(tmp_path):
    import json

    import torch
    import triton

    proc, out = _dry_launch(tmp_path, STAGES="env")                 # this box: not the GPU box's pair
    stack = json.loads((out / "env.json").read_text())["stack"]
    assert stack["match"] is False and stack["tested_pair"] == "torch 2.11.0+cu130 with triton 3.6.0"
    assert "NOT THE TESTED PAIR" in proc.stdout and "NOT THE TESTED PAIR" in (out / "summary.txt").read_text()
    here = f"torch=={torch.__version__} triton=={triton.__version__}"
    proc, out = _dry_launch(tmp_path / "again", STAGES="env", TESTED_STACK=here)
    assert json.loads((out / "env.json").read_text())["stack"]["match"] is True
    assert "the pair tested here" in proc.stdout and "NOT THE TESTED PAIR" not in proc.stdout


@pytest.mark.skipif(sys.version_info[:2] == (3, 12), reason="the fake cp312 wheel would be installable here")
def test_the_wheels_stage_says_when_the_bundle_was_made_for_another_torch_triton_pair(tmp_path):
    import torch
    import triton

    bundle = _bundle(tmp_path)
    manifest = bundle / "MANIFEST.tsv"
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join([lines[0], "# box-stack: torch==2.11.0+cu130 triton==3.6.0", *lines[1:]]) + "\n")
    proc = _run(tmp_path / "out", bundle)
    stages = dict(line.split("\t")[:2] for line in (tmp_path / "out" / "stages.tsv").read_text().splitlines()[1:])
    assert stages["wheels"] == "ok", proc.stdout[-3000:]                 # said, not failed: results still count
    assert "NOT THE TESTED PAIR: the bundle was made for torch==2.11.0+cu130 triton==3.6.0" in proc.stdout
    assert f"this box has torch=={torch.__version__} triton=={triton.__version__}" in proc.stdout
