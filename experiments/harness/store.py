"""Results on disk: results/<hardware>/<run-id>/{rows.csv, env.json, config.yaml}.

One tidy row per (point, method), appended and fsync'ed as soon as it is finished, so a crash loses at most
the point in flight. A run never overwrites another: a new run directory is created exclusively (an
automatic run-id that collides gets a -2, -3 ... suffix; an explicit one is refused), and an existing one is
only reopened by `resume`, which then skips the points whose config_hash already has a row (the kernel runner
also writes the missing default-launch row of a recorded tuned baseline point: experiments/kernel/run.py).

Several processes may write one run directory at once (two `resume=` of it, the shards of a Hydra multirun,
SLURM array jobs on a shared file system). Three file locks (fcntl.flock: released by the kernel when a
process dies, so a kill never leaves a stale lock) keep it consistent:
  <run dir>/.lock             held while a row is appended: the append re-reads the keys under it and drops a
                              row whose key is already there, so no key ever has two rows;
  <run dir>/.claims/<key>     held while a process measures that point: another process skips it;
  <parent>/.<run id>.lock     held while the jobs of one multirun create or join their shared run directory.
Provenance: the first process writes env.json / config.yaml; every later one env.<experiment>.json /
config.<experiment>.yaml (-2, -3 ... when that exists), and only when it has a point to run.

Columns (the contract with scripts/; empty = not applicable to the row's method):
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import math
import os
import re
import shlex
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from tqdm import tqdm

COLUMNS = [
    "experiment", "family", "model", "tp", "geometry", "method", "route", "backend", "batch", "buffer_len", "spec_T",
    "history_len", "acceptance", "mean_accepted", "state_dtype", "act_dtype", "context_len", "timing_mode", "l2",
    "cursors", "num_slots",
    "cache_resident", "compiled", "launch_source", "launch_config", "threads", "median_us", "p20_us", "p80_us",
    "flush_us", "step_h0_us", "step_hmid_us", "bytes_model",
    "byte_model_ratio", "achieved_GBps", "pct_peak_measured", "pct_peak_datasheet", "peak_mem_bytes",
    "footprint_bytes", "tokens_per_s", "rel_err", "status", "message", "config_hash", "run_id",
]
STATUSES = ("ok", "wrong", "oom", "error", "skipped")
# `launch_source`: where the row's Triton launch configs came from (replayssm/launch_table.py): tuned (this
# device's table), default (the hand rule: no entry, or the default baseline timed beside a tuned one),
# mixed (some of each), n/a (no Triton launch: torch / cpu backends, peers); `launch_config` lists them,
# `kernel[field=value,...]` per distinct config, "; "-separated.
# `cursors`: the rows' cursor layout (aligned | staggered | h=k; empty for a method without a cursor) and
# `num_slots` the pool the rows map into (experiments/harness/fixture.py). An AR replay row times its cycle
# (median_us: the mean step over L steps) and, beside it, one step with every row at write position 0
# (step_h0_us), L/2 (step_hmid_us) and L-1 (flush_us, the fold). A ring-verify row (replay_spec) likewise
# times one window (verify + commit of one token) with every row at ring position 0 (step_h0_us: verify rows,
# nothing folds), the middle (step_hmid_us) and the last before the early flush (flush_us: every row folds);
# its median_us is the cycle under the acceptance schedule, a mixed batch with `cursors=staggered`.
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


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (created if absent) for the with-block; it blocks until free."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                             # closing the descriptor releases the lock


class KeyIndex:
    """The set of `key` values in a CSV table, read incrementally: each refresh parses only the bytes appended
    since the last one (rows.csv of a paper sweep is ~2,000 rows; re-reading it per append would cost seconds)."""

    def __init__(self, path: Path, key: str):
        self.path, self.key, self.keys, self.offset, self.column = Path(path), key, set(), 0, None

    def refresh(self) -> set[str]:
        with open(self.path, newline="") as f:
            f.seek(self.offset)
            text = f.read()
            self.offset = f.tell()
        reader = csv.reader(io.StringIO(text))
        if self.column is None:
            header = next(reader, [])
            if self.key not in header:
                raise ValueError(f"{self.path}: no {self.key!r} column")
            self.column = header.index(self.key)
        self.keys.update(r[self.column] for r in reader if len(r) > self.column)
        return self.keys


def append_unique(path: Path, columns: list[str], rows: list[dict], index: KeyIndex, lock: Path) -> int:
    """Append `rows` (all rows of one key, e.g. an accuracy series' checkpoints) under `lock`, unless their key
    already has a row (another process wrote it meanwhile); durable before returning. The number appended."""
    if not rows:
        return 0
    with locked(lock):
        if rows[0][index.key] in index.refresh():
            return 0
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            for row in rows:
                writer.writerow({k: _cell(row.get(k)) for k in columns})
            f.flush()
            os.fsync(f.fileno())
        index.refresh()
    return len(rows)


# ---------------------------------------------------------------------------------------- shards, multirun

def shard_of(key: str, count: int) -> int:
    """The shard (0 .. count-1) a point belongs to: its config hash (hex) mod count, the same in every process."""
    return int(key, 16) % count if count > 1 else 0


def parse_shard(data: dict) -> tuple[int, int]:
    """(index, count) from the config's `shard: {index, count}`; a clear error for a bad pair."""
    shard = data.get("shard") or {}
    index, count = shard.get("index", 0), shard.get("count", 1)
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"shard.count: {count!r}; expected an integer >= 1")
    if not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"shard.index: {index!r}; expected an integer in [0, {count - 1}] (shard.count={count})")
    return index, count


def multirun_dir() -> str | None:
    """The sweep directory when this process is one job of a Hydra multirun (every job of it, on any launcher,
    sees the same one), else None."""
    if "hydra" not in sys.modules:
        return None
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    cfg = HydraConfig.get()
    return str(Path(cfg.sweep.dir).resolve()) if cfg.mode == RunMode.MULTIRUN else None


class RunStore:
    """An open run directory. `columns`: the row contract (a subclass may extend COLUMNS, e.g. engine rows)."""

    columns: list[str] = COLUMNS

    def __init__(self, run_dir: Path, run_id: str):
        self.run_dir, self.run_id = Path(run_dir), run_id
        self.rows_path = self.run_dir / "rows.csv"
        self.lock_path = self.run_dir / ".lock"
        self._index: KeyIndex | None = None

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
    def join(cls, root: Path, hardware: str, run_id: str, token: str) -> RunStore:
        """The run directory shared by the jobs of one multirun (`token`: its sweep directory): the first job
        creates it, the others join it; a directory of another run with that name is refused."""
        parent = Path(root) / hardware
        parent.mkdir(parents=True, exist_ok=True)
        run_dir = parent / run_id
        marker = run_dir / ".multirun"
        with locked(parent / f".{run_id}.lock"):
            if run_dir.exists():
                if not marker.is_file() or marker.read_text() != token:
                    raise ValueError(f"run_id: {run_dir} already exists and is not this multirun's ({token}); "
                                     f"pass resume={run_dir} to continue it or choose another run_id")
                return cls.resume(run_dir)
            run_dir.mkdir()
            with open(run_dir / "rows.csv", "w", newline="") as f:
                csv.DictWriter(f, fieldnames=cls.columns).writeheader()
            marker.write_text(token)
        return cls(run_dir, run_id)

    @classmethod
    def open(cls, data: dict, hardware: str) -> RunStore:
        """The run a composed config asks for: `resume=<run dir>` joins it; in a Hydra multirun every job joins
        one run directory (named `run_id`, or after the sweep directory); else a new run under `out_dir`
        (default <repo>/results) named `run_id` (explicit: refused if taken) or a fresh id."""
        if data.get("resume"):
            return cls.resume(Path(data["resume"]))
        from experiments.harness.env import REPO_ROOT, new_run_id  # deferred: env loads torch, the store needs none

        root = Path(data["out_dir"]) if data.get("out_dir") else REPO_ROOT / "results"
        sweep_dir = multirun_dir()
        if sweep_dir:
            run_id = data.get("run_id") or "multirun-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(sweep_dir).name)
            return cls.join(root, hardware, run_id, sweep_dir)
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
        if self._index is None:
            self._index = KeyIndex(self.rows_path, "config_hash")
        return set(self._index.refresh())

    def read_rows(self) -> list[dict]:
        with open(self.rows_path, newline="") as f:
            return list(csv.DictReader(f))

    def append(self, row: dict, extra: Sequence[dict] = ()) -> bool:
        """Append one point's row, and `extra` rows that belong to it (the default-launch row of a tuned
        baseline point), in one durable write: a run stopped in between cannot keep the row without its extras
        (a resume skips every point whose config_hash has a row; for a run directory that still holds a tuned
        row alone, the kernel runner's `missing_defaults` writes the default row). False (nothing written) when
        its config_hash already has a row (another process measured the point)."""
        for r in (row, *extra):
            missing = set(self.columns) - set(r)
            if missing:
                raise ValueError(f"row lacks columns {sorted(missing)}")
            if r["status"] not in STATUSES:
                raise ValueError(f"row status {r['status']!r} not in {STATUSES}")
        if self._index is None:
            self._index = KeyIndex(self.rows_path, "config_hash")
        return append_unique(self.rows_path, self.columns, [row, *extra], self._index, self.lock_path) > 0

    @contextlib.contextmanager
    def claim(self, key: str, done: Callable[[], set[str]] | None = None) -> Iterator[bool]:
        """True for the with-block when this process may measure point `key`: no other live process holds its
        claim and (`done`, default this run's rows) it has no row yet. The claim dies with the process."""
        claims = self.run_dir / ".claims"
        claims.mkdir(exist_ok=True)
        fd = os.open(claims / key, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield key not in (done or self.done_hashes)()
        finally:
            os.close(fd)

    def write_json(self, name: str, data: dict) -> Path:
        path = self.run_dir / name
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.run_dir / name
        path.write_text(text)
        return path

    def write_provenance(self, experiment: str, env: dict, config_text: str) -> str:
        """env.json + config.yaml for the run's first writer; env.<experiment>.json + config.<experiment>.yaml
        for a later one (a second experiment joining, a resume, a shard), numbered -2, -3 ... when taken.
        Reserved under the run's lock, so concurrent writers never share a name. Returns the env file's name."""
        with locked(self.lock_path):
            if not (self.run_dir / "env.json").exists():
                stem = ""
            else:
                stem, n = f".{experiment}", 1
                while (self.run_dir / f"env{stem}.json").exists():
                    n += 1
                    stem = f".{experiment}-{n}"
            name = f"env{stem}.json"
            self.write_json(name, env)
        self.write_text(f"config{stem}.yaml", config_text)
        return name


def failure(exc: BaseException) -> tuple[str, str]:
    """(status, message) of a point that raised: `oom` for an allocator failure, else `error` with where it was
    raised. Every runner records a failing point this way and goes on with the sweep."""
    import torch  # deferred: readers of this module (COLUMNS, RunStore) need no torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or _cpu_alloc_failure(exc):
        return "oom", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    frames = traceback.extract_tb(exc.__traceback__)        # empty for an exception that was never raised
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return "error", f"{type(exc).__name__}: {str(exc)[:300]}{where}"


def _cpu_alloc_failure(exc: BaseException) -> bool:
    """torch's CPU allocator raises a plain RuntimeError (`DefaultCPUAllocator: can't allocate memory: ...
    Error code 12 (Cannot allocate memory)`), not OutOfMemoryError: it is an oom all the same."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "Cannot allocate memory" in text)


# ------------------------------------------------------------------------------------------- the loop

def resume_command(experiment: str, run_dir: Path, argv: list[str] | None = None) -> str:
    """The command that continues this run: the same module and overrides, with resume= instead of run_id=."""
    args = [a for a in (sys.argv[1:] if argv is None else argv)
            if not a.startswith(("run_id=", "out_dir=", "resume=", "-m", "--multirun"))]
    return shlex.join(["python", "-m", f"experiments.{experiment}", f"resume={run_dir}", *args])


def run_pending(items: Iterable, key: Callable, work: Callable, append: Callable, claim: Callable, *,
                experiment: str, run_dir: Path, desc: str, show: bool, stop: Callable[[], bool] | None = None) -> int:
    """For each item (already filtered to this shard and to keys without rows): measure it under its claim and
    append its rows; skip one another live process is measuring. `stop()` true (the time budget is spent):
    end cleanly before the next item with a note and the resume command. Ctrl-C: a note of the rows kept
    and the exact resume command, then exit 130 (no traceback). Returns the number of items appended."""

    kept, items = 0, list(items)
    try:
        for i, item in enumerate(tqdm(items, desc=desc, unit="pt", disable=not show)):
            if stop is not None and stop():
                print(f"time budget spent: {len(items) - i} points of {desc} not run (kept: {kept} written now); "
                      f"continue with:\n  {resume_command(experiment, run_dir)}", file=sys.stderr)
                break
            with claim(key(item)) as mine:
                if mine and append(work(item)):
                    kept += 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: {kept} points written by this process are kept in {run_dir} (rows.csv is fsync'ed "
              f"per point); continue with:\n  {resume_command(experiment, run_dir)}", file=sys.stderr)
        raise SystemExit(130) from None
    return kept


class RunTable:
    """A second table of a run directory (e.g. accuracy.csv of experiments/accuracy.py) with its own columns,
    kept beside rows.csv so a run that joins the kernel sweeps (`resume=`) leaves their contract untouched.
    Same rules as rows.csv: header written once, each key's rows appended together, fsync'ed and never twice
    (under the run's lock); `done_keys` lets a resumed run skip what is already there."""

    def __init__(self, store: RunStore, name: str, columns: list[str], key: str):
        self.store, self.path, self.columns, self.key = store, store.run_dir / name, list(columns), key
        with locked(store.lock_path):
            if not self.path.exists():
                with open(self.path, "w", newline="") as f:
                    csv.DictWriter(f, fieldnames=self.columns).writeheader()
            else:
                with open(self.path, newline="") as f:
                    if next(csv.reader(f), []) != self.columns:
                        raise ValueError(f"{self.path} has different columns than this experiment writes")
        self.index = KeyIndex(self.path, key)

    def done_keys(self) -> set[str]:
        return set(self.index.refresh())

    def append_many(self, rows: list[dict]) -> int:
        """Append the rows of one key (unless that key already has rows); the number appended."""
        for row in rows:
            missing = set(self.columns) - set(row)
            if missing:
                raise ValueError(f"row lacks columns {sorted(missing)}")
        return append_unique(self.path, self.columns, rows, self.index, self.store.lock_path)
