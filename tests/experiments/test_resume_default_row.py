"""Resume completes a tuned baseline point whose default-launch row is missing (experiments/kernel/run.py).

A tuned baseline point is recorded as two rows: the tuned one and its default-launch row (config_hash +
DEFAULT_SUFFIX). Since they are appended in one write a fresh run cannot keep one without the other, but a run
directory written before that change, or torn by a kill inside the write, can hold the tuned row alone; a
resume skips every config_hash that has a row, so without `missing_defaults` it never wrote the default row.
Here the run really is killed between the two (Ctrl-C raised after the tuned row is on disk, as the two
appends of the old runner allowed), then resumed: the default row appears exactly once and nothing doubles.
Triton interpreter, tiny Mamba-2, batch 2, a launch table with one tuned entry (as tests/experiments/test_tune).
"""

from __future__ import annotations

import csv
import shlex

import pytest

from experiments.harness.entry import load_config
from experiments.harness.store import RunStore
from experiments.kernel.run import DEFAULT_SUFFIX, run_experiment
from replayssm import launch_table
from replayssm.checks import interpreter_active

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="runs the Triton kernels in the interpreter")

OVERRIDES = ["sweep=smoke", "sweep.on_cpu.backend=triton", "sweep.on_cpu.batch=[2]", "sweep.models=[tiny_mamba2]",
             "sweep.on_cpu.models=[tiny_mamba2]", "method.names=[baseline_ar]", "progress=false"]
TUNED = {"mamba2_ssu_ar": {"dstate=16,headdim=16|float32": {"config": {"block_m": 8, "num_warps": 2},
                                                            "ms": 0.5, "default_ms": 1.0}}}


@pytest.fixture
def tuned_table(tmp_path, monkeypatch):
    """A launch table in which the tiny Mamba-2 baseline step has a tuned config."""
    monkeypatch.setenv(launch_table.TABLE_ENV, str(tmp_path / "tables"))
    launch_table.reload()
    launch_table.save("interpreter", TUNED, {"dry_run": True}, tmp_path / "tables")
    yield
    launch_table.reload()


def _rows(run_dir) -> list[dict]:
    with open(run_dir / "rows.csv", newline="") as f:
        return list(csv.DictReader(f))


def _killed_after_the_tuned_row(monkeypatch):
    """RunStore.append as a run killed between the pair's writes leaves it: the point's own row reaches the disk,
    then Ctrl-C arrives before its extras (the default-launch row) are written."""
    append = RunStore.append

    def killed(self, row, extra=()):
        append(self, row)
        if extra:
            raise KeyboardInterrupt
        return True
    monkeypatch.setattr(RunStore, "append", killed)


def test_a_run_killed_between_the_tuned_and_default_rows_gets_the_default_row_on_resume(
        tuned_table, tmp_path, monkeypatch, capsys):
    cfg = OVERRIDES + [f"out_dir={tmp_path / 'runs'}", "run_id=killed"]
    with monkeypatch.context() as m:
        _killed_after_the_tuned_row(m)
        with pytest.raises(SystemExit) as stop:
            run_experiment(load_config("kernel_decode", cfg))
    assert stop.value.code == 130
    resume = shlex.split(capsys.readouterr().err.strip().splitlines()[-1])[3]     # resume=<run dir>
    run_dir = tmp_path / "runs" / "cpu" / "killed"
    assert resume == f"resume={run_dir}"
    (tuned,) = _rows(run_dir)                                   # the kill left the tuned row alone
    assert tuned["launch_source"] == "tuned" and tuned["method"] == "baseline_ar"

    resumed = run_experiment(load_config("kernel_decode", OVERRIDES + [resume]))
    (default,) = resumed.rows                                  # just the missing row: the point is not re-run
    assert default["config_hash"] == tuned["config_hash"] + DEFAULT_SUFFIX
    assert default["launch_source"] == "default" and default["status"] == "ok"
    assert default["launch_config"] == "mamba2_ssu_ar[block_m=16,block_n=16,num_warps=4]"
    assert resumed.resumed_skipped == 1
    on_disk = _rows(run_dir)
    assert [r["config_hash"] for r in on_disk] == [tuned["config_hash"], default["config_hash"]]
    assert on_disk[0] == tuned                                 # the recorded tuned row is left as it was
    with open(run_dir / "host_costs.csv", newline="") as f:    # its host costs once too (none for the lost row)
        assert [r["config_hash"] for r in csv.DictReader(f)] == [default["config_hash"]]

    again = run_experiment(load_config("kernel_decode", OVERRIDES + [resume]))
    assert again.rows == [] and again.resumed_skipped == 1      # complete: a second resume writes nothing
    assert _rows(run_dir) == on_disk


def test_an_old_run_dir_with_only_the_tuned_row_is_completed_and_a_default_sourced_row_is_not(
        tuned_table, tmp_path):
    """The same from a run directory as a pre-pair runner left it (rows.csv edited to drop the default row);
    and a baseline row that ran default configs (no table entry) never asks for a default row."""
    cfg = OVERRIDES + [f"out_dir={tmp_path / 'runs'}"]
    first = run_experiment(load_config("kernel_decode", cfg))
    tuned, default = first.rows
    rows = first.run_dir / "rows.csv"
    lines = rows.read_text().splitlines(keepends=True)
    assert len(lines) == 3 and default["config_hash"] in lines[2]
    rows.write_text("".join(lines[:2]))

    resumed = run_experiment(load_config("kernel_decode", OVERRIDES + [f"resume={first.run_dir}"]))
    assert [r["config_hash"] for r in resumed.rows] == [default["config_hash"]]
    assert [r["config_hash"] for r in _rows(first.run_dir)] == [tuned["config_hash"], default["config_hash"]]

    (tmp_path / "tables" / "interpreter.json").unlink()        # no table: the baseline runs default configs
    launch_table.reload()
    plain = run_experiment(load_config("kernel_decode", OVERRIDES + [f"out_dir={tmp_path / 'plain'}"]))
    (row,) = plain.rows
    assert row["launch_source"] == "default"
    again = run_experiment(load_config("kernel_decode", OVERRIDES + [f"resume={plain.run_dir}"]))
    assert again.rows == [] and again.resumed_skipped == 1
