"""Results on disk: results/<hardware>/<run-id>/{rows.csv, env.json, config.yaml}.

One tidy row per (point, method), appended and fsync'ed as soon as it is finished, so a crash loses at most
the point in flight. A run never overwrites another: a new run directory is created exclusively (an
automatic run-id that collides gets a -2, -3 ... suffix; an explicit one is refused), and an existing one is
only reopened by `resume`, which then skips the points whose config_hash already has a row.

Columns (the contract with scripts/; empty = not applicable to the row's method):
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

COLUMNS = [
    "experiment", "family", "model", "tp", "geometry", "method", "route", "backend", "batch", "buffer_len", "spec_T",
    "history_len", "acceptance", "mean_accepted", "state_dtype", "act_dtype", "context_len", "timing_mode", "l2",
    "cache_resident", "compiled", "threads", "median_us", "p20_us", "p80_us", "flush_us", "bytes_model",
    "byte_model_ratio", "achieved_GBps", "pct_peak_measured", "pct_peak_datasheet", "peak_mem_bytes",
    "footprint_bytes", "tokens_per_s", "rel_err", "status", "message", "config_hash", "run_id",
]
STATUSES = ("ok", "wrong", "oom", "error", "skipped")
# `geometry` is the shape one rank's kernel sees ("dstate=128 headdim=64 ngroups=1 nheads=16"), so a run with
# an overridden geometry (model.geometry.headdim=17) says so in every row, not just by the model's name.
__doc__ += "    " + ", ".join(COLUMNS) + "\n"


def _cell(value):
    """CSV cell: None / NaN -> empty; floats with enough digits for microsecond timings."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


class RunStore:
    """An open run directory. `columns`: the row contract (a subclass may extend COLUMNS, e.g. engine rows)."""

    columns: list[str] = COLUMNS

    def __init__(self, run_dir: Path, run_id: str):
        self.run_dir, self.run_id = Path(run_dir), run_id
        self.rows_path = self.run_dir / "rows.csv"

    # ------------------------------------------------------------------------------------------- opening
    @classmethod
    def create(cls, root: Path, hardware: str, run_id: str, *, explicit: bool = False) -> RunStore:
        """A new run directory root/<hardware>/<run_id>; never reuses an existing one."""
        parent = Path(root) / hardware
        parent.mkdir(parents=True, exist_ok=True)
        candidate, n = run_id, 1
        while True:
            try:
                (parent / candidate).mkdir()            # exclusive: fails if another run holds the name
                break
            except FileExistsError:
                if explicit:
                    raise ValueError(f"run_id: {parent / candidate} already exists; a run never overwrites "
                                     f"another (pass resume={parent / candidate} to continue it)") from None
                n += 1
                candidate = f"{run_id}-{n}"
        store = cls(parent / candidate, candidate)
        with open(store.rows_path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=cls.columns).writeheader()
        return store

    @classmethod
    def open(cls, data: dict, hardware: str) -> RunStore:
        """The run a composed config asks for: `resume=<run dir>` joins it, else a new run under `out_dir`
        (default <repo>/results) named `run_id` (explicit: refused if taken) or a fresh id."""
        if data.get("resume"):
            return cls.resume(Path(data["resume"]))
        from experiments.harness.env import REPO_ROOT, new_run_id

        root = Path(data["out_dir"]) if data.get("out_dir") else REPO_ROOT / "results"
        return cls.create(root, hardware, data.get("run_id") or new_run_id(), explicit=bool(data.get("run_id")))

    @classmethod
    def resume(cls, run_dir: Path) -> RunStore:
        run_dir = Path(run_dir)
        rows = run_dir / "rows.csv"
        if not rows.is_file():
            raise ValueError(f"resume: {run_dir} is not a run directory (no rows.csv)")
        with open(rows, newline="") as f:
            header = next(csv.reader(f), [])
        if header != cls.columns:
            raise ValueError(f"resume: {rows} has different columns than this harness writes")
        return cls(run_dir, run_dir.name)

    # ------------------------------------------------------------------------------------------- content
    def done_hashes(self) -> set[str]:
        with open(self.rows_path, newline="") as f:
            return {row["config_hash"] for row in csv.DictReader(f)}

    def read_rows(self) -> list[dict]:
        with open(self.rows_path, newline="") as f:
            return list(csv.DictReader(f))

    def append(self, row: dict) -> None:
        """Append one row and make it durable before returning."""
        missing = set(self.columns) - set(row)
        if missing:
            raise ValueError(f"row lacks columns {sorted(missing)}")
        if row["status"] not in STATUSES:
            raise ValueError(f"row status {row['status']!r} not in {STATUSES}")
        with open(self.rows_path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns).writerow({k: _cell(row[k]) for k in self.columns})
            f.flush()
            os.fsync(f.fileno())

    def write_json(self, name: str, data: dict) -> Path:
        path = self.run_dir / name
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.run_dir / name
        path.write_text(text)
        return path

    def env_name(self) -> str:
        """env.json for a new run; env.resume-N.json for each resume (the original provenance is kept)."""
        if not (self.run_dir / "env.json").exists():
            return "env.json"
        n = 1
        while (self.run_dir / f"env.resume-{n}.json").exists():
            n += 1
        return f"env.resume-{n}.json"


class RunTable:
    """A second table of a run directory (e.g. accuracy.csv of experiments/accuracy.py) with its own columns,
    kept beside rows.csv so a run that joins the kernel sweeps (`resume=`) leaves their contract untouched.
    Same rules as rows.csv: header written once, each row appended and fsync'ed; `done_keys` lets a resumed
    run skip what is already there."""

    def __init__(self, store: RunStore, name: str, columns: list[str], key: str):
        self.path, self.columns, self.key = store.run_dir / name, list(columns), key
        if not self.path.exists():
            with open(self.path, "w", newline="") as f:
                csv.DictWriter(f, fieldnames=self.columns).writeheader()
        else:
            with open(self.path, newline="") as f:
                if next(csv.reader(f), []) != self.columns:
                    raise ValueError(f"{self.path} has different columns than this experiment writes")

    def done_keys(self) -> set[str]:
        with open(self.path, newline="") as f:
            return {row[self.key] for row in csv.DictReader(f)}

    def append_many(self, rows: list[dict]) -> None:
        for row in rows:
            missing = set(self.columns) - set(row)
            if missing:
                raise ValueError(f"row lacks columns {sorted(missing)}")
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            for row in rows:
                writer.writerow({k: _cell(row[k]) for k in self.columns})
            f.flush()
            os.fsync(f.fileno())
