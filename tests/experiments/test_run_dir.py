"""Run-directory mechanics (experiments/harness/store.py): the lock that keeps one row per config_hash when
several processes write a run, per-point claims, Ctrl-C with the resume command, a Hydra multirun (and its
shards) landing in one run directory with the same points as an unsharded run."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness_doubles import compose

from experiments.harness.entry import config_dict
from experiments.harness.points import expand
from experiments.harness.store import COLUMNS, KeyIndex, RunStore, append_unique, parse_shard, run_pending, shard_of
from experiments.kernel.run import run_experiment

ROOT = Path(__file__).resolve().parents[2]
# a small CPU sweep: 2 models x 2 batches x (baseline + replay per route): 10 points of a few ms each
SMALL = ["sweep=cpu", "sweep.models=[tiny_mamba2,tiny_gdn]", "sweep.batch=[1,2]", "sweep.buffer_len=[4]",
         "method.names=[baseline_ar,replay_ar]", "timing.cpu_repeats=3", "timing.cpu_warmup=1", "progress=false"]


def _hashes(run_dir: Path) -> list[str]:
    with open(run_dir / "rows.csv", newline="") as f:
        return [r["config_hash"] for r in csv.DictReader(f)]


def _planned(tmp_path: Path, overrides: list[str]) -> set[str]:
    return {p.config_hash() for p in expand(config_dict(compose(tmp_path, overrides=overrides))).points}


def _row(key: str) -> dict:
    return {c: "" for c in COLUMNS} | {"config_hash": key, "status": "ok"}


def test_append_drops_a_row_whose_key_another_writer_already_wrote(tmp_path):
    a = RunStore.create(tmp_path, "cpu", "r")
    b = RunStore.resume(a.run_dir)                                 # a second process's view of the same run
    assert a.done_hashes() == set() and b.done_hashes() == set()
    assert a.append(_row("ab12")) is True
    assert b.append(_row("ab12")) is False                         # b's cached index was stale: re-read under lock
    assert b.append(_row("cd34")) is True and a.done_hashes() == {"ab12", "cd34"}
    assert _hashes(a.run_dir) == ["ab12", "cd34"]
    # a multi-row key (an accuracy series) goes in whole or not at all
    path = a.run_dir / "t.csv"
    path.write_text("series_hash,step\n")
    index = KeyIndex(path, "series_hash")
    rows = [{"series_hash": "k", "step": s} for s in (1, 2, 3)]
    assert append_unique(path, ["series_hash", "step"], rows, index, a.lock_path) == 3
    assert append_unique(path, ["series_hash", "step"], rows, KeyIndex(path, "series_hash"), a.lock_path) == 0
    assert len(path.read_text().splitlines()) == 4


def test_a_point_and_its_default_launch_row_are_one_write(tmp_path):
    """A tuned baseline point brings its default-launch row (experiments/kernel/run.py): both land together or
    neither does, so a run stopped in between cannot keep the point without its default row, which a resume
    (skipping every config_hash with a row) would then never write."""
    a = RunStore.create(tmp_path, "cpu", "r")
    bad = _row("ab12-default") | {"status": "bogus"}
    with pytest.raises(ValueError, match="not in"):
        a.append(_row("ab12"), [bad])
    assert _hashes(a.run_dir) == []                                # the valid main row was not written alone
    assert a.append(_row("ab12"), [_row("ab12-default")]) is True
    assert a.append(_row("ab12"), [_row("ab12-default")]) is False
    assert _hashes(a.run_dir) == ["ab12", "ab12-default"]


def test_a_claimed_point_is_skipped_by_another_process_and_freed_when_released(tmp_path):
    a = RunStore.create(tmp_path, "cpu", "r")
    b = RunStore.resume(a.run_dir)
    with a.claim("ab12") as mine_a:
        assert mine_a is True
        with b.claim("ab12") as mine_b:                            # flock: a separate open file description
            assert mine_b is False
    with b.claim("ab12") as mine_b:
        assert mine_b is True
    a.append(_row("ab12"))
    with b.claim("ab12") as mine_b:
        assert mine_b is False                                     # free, but done: nothing to measure


def test_ctrl_c_prints_the_rows_kept_and_the_resume_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["kernel_decode.py", "sweep=cpu", "run_id=x", "sweep.batch=[1]"])
    store = RunStore.create(tmp_path, "cpu", "x")

    def work(key):
        if key == "03":
            raise KeyboardInterrupt
        return _row(key)

    with pytest.raises(SystemExit) as exit_info:
        run_pending(["01", "02", "03"], lambda k: k, work, store.append, store.claim, experiment="kernel_decode",
                    run_dir=store.run_dir, desc="t", show=False)
    assert exit_info.value.code == 130
    err = capsys.readouterr().err
    assert "interrupted: 2 points" in err and "Traceback" not in err
    assert f"python -m experiments.kernel_decode resume={store.run_dir} sweep=cpu 'sweep.batch=[1]'" in err
    assert _hashes(store.run_dir) == ["01", "02"]


def test_shards_partition_the_points_and_bad_shards_are_refused():
    keys = [f"{i:016x}" for i in range(0, 10_000, 7)]
    parts = [{k for k in keys if shard_of(k, 3) == i} for i in range(3)]
    assert set().union(*parts) == set(keys) and sum(map(len, parts)) == len(keys)
    assert parse_shard({"shard": {"index": 1, "count": 2}}) == (1, 2) and parse_shard({}) == (0, 1)
    for bad in ({"index": 2, "count": 2}, {"index": 0, "count": 0}, {"index": "a", "count": 2}):
        with pytest.raises(ValueError, match="shard"):
            parse_shard({"shard": bad})


def test_two_concurrent_resumes_write_every_point_once(tmp_path):
    first = run_experiment(compose(tmp_path, overrides=SMALL + ["sweep.batch=[1]", "sweep.models=[tiny_mamba2]"]))
    assert 0 < len(first.rows) < len(_planned(tmp_path, SMALL))
    cmd = [sys.executable, "-m", "experiments.kernel_decode", *SMALL, f"resume={first.run_dir}",
           f"hydra.run.dir={tmp_path}/hydra"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    hashes = _hashes(first.run_dir)
    assert len(hashes) == len(set(hashes)) and set(hashes) == _planned(tmp_path, SMALL)
    with open(first.run_dir / "host_costs.csv", newline="") as f:     # host seconds per point, once each
        host = list(csv.DictReader(f))
    assert sorted(r["config_hash"] for r in host) == sorted(hashes)
    assert all(float(r["gate_s"]) > 0 and float(r["build_s"]) > 0 for r in host if r["timing_s"])


def test_sharded_multirun_writes_one_run_dir_with_the_unsharded_points_and_a_kill_resumes(tmp_path):
    """Two shards, two worker processes (Hydra's joblib launcher when installed), one run directory; then
    Ctrl-C on a plain run and its printed resume command completes it without duplicates."""
    whole = run_experiment(compose(tmp_path / "whole", overrides=SMALL))
    want = {r["config_hash"] for r in whole.rows}
    assert want == _planned(tmp_path, SMALL) and len(want) >= 8
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    try:
        import hydra_plugins.hydra_joblib_launcher  # noqa: F401
        launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    except ImportError:                            # the basic launcher runs the two shards one after the other
        launcher = []
    out = tmp_path / "sharded"
    cmd = [sys.executable, "-m", "experiments.kernel_decode", "--multirun", *SMALL, "shard.count=2",
           "shard.index=0,1", f"out_dir={out}", f"hydra.sweep.dir={tmp_path}/mr", *launcher]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dirs = [p for p in (out / "cpu").iterdir() if p.is_dir()]
    assert [p.name for p in run_dirs] == ["multirun-mr"]
    hashes = _hashes(run_dirs[0])
    assert len(hashes) == len(set(hashes)) and set(hashes) == want
    assert {p.name for p in run_dirs[0].glob("env*.json")} == {"env.json", "env.kernel_decode.json"}

    # Ctrl-C after the first row, then the printed command: the same points, none twice. SMALL's 8 points take
    # about 0.25 s in all, so a signal sent after the first row often landed after the last one (in interpreter
    # shutdown, where SIGINT is SIG_DFL again); 1000 timed repeats per point (not part of a point's hash) keep
    # the sweep running for seconds after the first row
    slow = [o.replace("cpu_repeats=3", "cpu_repeats=1000") for o in SMALL]
    cmd = [sys.executable, "-m", "experiments.kernel_decode", *slow, f"out_dir={tmp_path / 'killed'}",
           "run_id=k", f"hydra.run.dir={tmp_path}/hydra"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows = tmp_path / "killed" / "cpu" / "k" / "rows.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (rows.is_file() and len(rows.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the sweep finished before the interrupt landed")
    # exit status 130 as a shell reports it: SystemExit(130), or death by SIGINT (-2 here), which CPython chooses
    # under `python -m` when the interrupt escaped an exec() of a source string somewhere below our handler: that
    # sets its unhandled-KeyboardInterrupt flag, which outranks the SystemExit code (`exec("raise KeyboardInterrupt")`
    # caught and turned into SystemExit(130) shows it: -2 under `-m`, 130 as a script)
    assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in err, err[-2000:]
    assert "interrupted:" in err, err[-2000:]
    resume = shlex.split(err.strip().splitlines()[-1])
    assert resume[:3] == ["python", "-m", "experiments.kernel_decode"] and resume[3].startswith("resume=")
    done = subprocess.run([sys.executable, *resume[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    hashes = _hashes(rows.parent)
    assert len(hashes) == len(set(hashes)) and set(hashes) == want


def test_a_spent_budget_stops_before_the_next_point_and_says_how_to_continue(tmp_path, capsys):
    result = run_experiment(compose(tmp_path, overrides=SMALL + [f"budget.deadline={time.time() - 1}"]))
    assert result.rows == [] and _hashes(result.run_dir) == []
    assert "time budget spent" in capsys.readouterr().err


def test_claims_first_puts_the_published_settings_first(tmp_path):
    from experiments.harness.budget import Budget, claim_rank
    from experiments.published import CLAIMS

    over = ["sweep=cpu", "sweep.models=[tiny_mamba2]", "sweep.batch=[1,64,256]", "sweep.buffer_len=[4,16]",
            "method.names=[baseline_ar,replay_ar]"]
    points = expand(config_dict(compose(tmp_path, overrides=over))).points
    ordered = Budget(claims_first=True).order(points, CLAIMS)
    ranks = [claim_rank(p, CLAIMS) for p in ordered]
    assert ranks == sorted(ranks) and sorted(map(id, ordered)) == sorted(map(id, points))
    assert ranks[0] < 2 and ranks[-1] == 2                  # some point answers a claim, some none


def test_the_gpu_paper_sweep_estimate_covers_every_experiment():
    from experiments.budget_estimate import CALIBRATION, estimate, render

    cal = json.loads(CALIBRATION.read_text())
    lines = estimate(cal=cal)
    assert [ln.experiment for ln in lines] == ["kernel_decode", "kernel_spec", "production", "state_formats",
                                               "tune (claims)", "default rows", "e2e_decode", "serving", "accuracy"]
    assert all(ln.points > 0 and ln.host_s > 0 and ln.total_s >= ln.host_s for ln in lines)
    assert "assumed" in render(lines, cal, "h200")            # the unmeasured launch cost is labelled as such
    tune = lines[4]                                           # launch tuning: its build cost is an assumption too
    assert "assumed" in tune.note and "without a launch table" in tune.note
