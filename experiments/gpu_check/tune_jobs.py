"""experiments.tune split into parallel jobs, one per (model, method, route or spec T), their launch tables
merged into one as each job ends.

    python -m experiments.gpu_check.tune_jobs --table DIR --logs DIR \\
        --job-set kernel_decode:gpu_kernel_decode:baseline_ar,replay_ar [--job-set ...] [--model M] [--dry-run]

Why: a tune is compile-bound. tune-check-20261204T130932Z-f5b9170 tuned one model's three AR kernels (44
candidates) in 248 s serially, ~5 s a candidate, almost all of it Triton's compiles on one CPU core, while
the GPU box has 16. So each job is its own `python -m experiments.tune` process (the same procedure and budget
for ReplaySSM and the baselines); the jobs run side by side, the longest first, TUNE_JOBS at a time (default:
the cores less two, at most 14: each holds a CUDA context and a point's cache at --batch, a few GB).

Timing stays one at a time: each job's process runs under `--worker`, which wraps replayssm.tuning.do_bench
(every candidate's timed window) in an exclusive lock on one file, so no two candidates are timed at once;
compiles and the correctness checks overlap (a check's single launch or a snapshot restore of another job
can still fall inside a window: milliseconds against the 25 ms of each window).

A job's table is merged (replayssm.launch_table.save) the moment it ends, so a stage killed at its limit keeps
every finished job's entries; the kernels of a job cut short run at their default configs (rows say
launch_source=default). Each job's log is LOGS/<job>.log; its tuned lines are echoed when it ends.

The jobs come from the named sweep files: their models (or --model), routes (kernel_decode's replay_ar: a
job per route the model's family has), spec_T and spec_routes (kernel_spec: a job per T, and replay_spec's per
ring form), tuned at --batch (default 256: the claims' batch; the
tune key has no batch). kernel_spec jobs drop its reference method (baseline_ar: the kernel_decode jobs tune
it). --dry-run: the interpreter, the sweep's on_cpu models and experiments.tune's fake timer (the procedure,
not a speed), one job of each set (the cheapest).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WEIGHT = {"replay_spec": 3, "commit_replay_spec": 3, "replay_ar": 2}     # longest first (candidates to compile)


@dataclass(frozen=True)
class Job:
    experiment: str
    sweep: str
    model: str
    method: str
    route: str | None = None
    spec_T: int | None = None

    @property
    def name(self) -> str:
        return "-".join(str(x) for x in (self.model, self.method, self.route, self.spec_T and f"T{self.spec_T}") if x)

    def argv(self, out: Path, batch: int, dry: bool) -> list[str]:
        over = [f"method.names=[{self.method}]"]
        if self.route:
            over += [f"sweep.spec_routes=[{self.route}]" if self.experiment == "kernel_spec"
                     else f"sweep.routes=[{self.route}]"]
        if self.experiment == "kernel_spec":
            over += [f"sweep.spec_T=[{self.spec_T}]", "experiment.reference_methods=[]"]
        if dry:           # experiments.tune --dry-run composes sweep=smoke itself: the model through on_cpu
            over += [f"sweep.on_cpu.models=[{self.model}]"]
        else:
            over = [f"sweep={self.sweep}", f"sweep.batch=[{batch}]", *over]
        return ["--experiment", self.experiment, "--all", "--geometry", self.model, "--out", str(out),
                *(["--dry-run"] if dry else []), "--", *over]


def jobs_of(job_set: str, models: list[str], dry: bool) -> list[Job]:
    """EXPERIMENT:SWEEP:METHOD,METHOD -> its jobs, from conf/sweep/SWEEP.yaml (its on_cpu block on a dry run)."""
    from omegaconf import OmegaConf

    experiment, sweep, methods = job_set.split(":")
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "sweep" / f"{sweep}.yaml"))
    if dry:
        cfg.update(cfg.get("on_cpu") or {})
    chosen = models if models and not dry else list(cfg.get("models") or [])
    if not chosen:
        raise SystemExit(f"tune_jobs: {sweep}.yaml names no models: give --model")
    from experiments.harness.methods import REGISTRY
    from experiments.harness.points import load_model_config

    out = []
    for model in chosen:
        for method in methods.split(","):
            # a route job only where the method has that route for the model's family (Mamba-2 has no
            # output_only_fold; the ring's forms are replay_spec's alone): a job with no point tunes nothing
            m = REGISTRY[method]
            has = m.routes(load_model_config(model)["family"], "triton") if m.routes("gdn") != (None,) else (None,)
            if experiment == "kernel_spec":
                forms = [r for r in cfg.get("spec_routes") or ["fused"] if r in has] or [None]
                out += [Job(experiment, sweep, model, method, route=r, spec_T=int(t))
                        for t in cfg.get("spec_T") or [4] for r in forms]
            elif method == "replay_ar":
                out += [Job(experiment, sweep, model, method, route=r)
                        for r in cfg.get("routes") or ["output_only"] if r in has]
            else:
                out.append(Job(experiment, sweep, model, method, route=(cfg.get("routes") or [None])[0]))
    return out


def merge(part: Path, table: Path, meta: dict) -> int:
    """A job's table (PART/<device>.json) into TABLE/<device>.json; returns its entry count."""
    from replayssm import launch_table

    count = 0
    for path in sorted(part.glob("*.json")):
        data = json.loads(path.read_text())
        entries = data.get("entries", {})
        keep = {k: data[k] for k in ("triton", "torch", "dry_run") if k in data}
        device = data.get("device", path.stem)
        # saved beside and renamed into place: a kill at the stage's limit never leaves a torn table that the
        # sweeps after it would fail to read
        scratch, dest = table / ".merge", launch_table.table_path(device, table)
        scratch.mkdir(parents=True, exist_ok=True)
        if dest.is_file():
            shutil.copyfile(dest, scratch / dest.name)
        os.replace(launch_table.save(device, entries, {**keep, **meta}, scratch), dest)
        count += sum(len(v) for v in entries.values())
    return count


def run_jobs(jobs: list[Job], args) -> int:
    args.logs.mkdir(parents=True, exist_ok=True)
    lock = args.logs / "timing.lock"
    width = args.jobs or int(os.environ.get("TUNE_JOBS") or min(14, max(2 if args.dry_run else 1,
                                                                         (os.cpu_count() or 2) - 2)))
    pending = sorted(jobs, key=lambda j: WEIGHT.get(j.method, 1), reverse=True)
    print(f"tune_jobs: {len(jobs)} jobs, {width} at a time -> {args.table}", flush=True)
    t0, running, failed, entries = time.time(), {}, [], 0
    meta = {"tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tune_jobs": f"{len(jobs)} experiments.tune jobs, {width} side by side, timing windows serialized"}
    while pending or running:
        while pending and len(running) < width:
            job = pending.pop(0)
            log = open(args.logs / f"{job.name}.log", "w")
            argv = [sys.executable, "-m", "experiments.gpu_check.tune_jobs", "--worker", str(lock), "--",
                    *job.argv(args.table / "parts" / job.name, args.batch, args.dry_run)]
            log.write("$ " + " ".join(argv) + "\n")
            log.flush()
            # the same process group as this driver: the runner's kill at the stage's limit reaches every job
            running[job] = (subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log, time.time())
        time.sleep(0.2)
        for job, (proc, log, started) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[job]
            text = (args.logs / f"{job.name}.log").read_text(errors="replace")
            if proc.returncode:
                failed.append(job.name)
                print(f"tune job {job.name}: FAILED rc={proc.returncode} after {time.time() - started:.0f} s: "
                      + " | ".join(text.strip().splitlines()[-3:])[:400], flush=True)
                continue
            meta["tune_seconds"] = round(time.time() - t0, 1)
            n = merge(args.table / "parts" / job.name, args.table, meta)
            entries += n
            print(f"tune job {job.name}: {n} entries in {time.time() - started:.0f} s", flush=True)
            for line in text.splitlines():
                if " ms (default " in line:
                    print(f"  {line}", flush=True)
    print(f"tune_jobs: {len(jobs) - len(failed)} of {len(jobs)} jobs ok, {entries} entries in "
          f"{time.time() - t0:.0f} s" + (f"; failed: {' '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def worker(lock: Path, argv: list[str]) -> int:
    """experiments.tune with every timed window under an exclusive lock on `lock` (one window at a time)."""
    from replayssm import tuning

    bench = tuning.do_bench

    def locked(fn):
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                return bench(fn)
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    tuning.do_bench = locked
    from experiments.tune import main as tune_main

    return tune_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return worker(Path(argv[1]), argv[argv.index("--") + 1:])
    ap = argparse.ArgumentParser(prog="python -m experiments.gpu_check.tune_jobs", description=__doc__.split("\n")[0])
    ap.add_argument("--table", type=Path, required=True, help="the merged launch table's directory")
    ap.add_argument("--logs", type=Path, required=True, help="one log per job")
    ap.add_argument("--job-set", action="append", required=True, metavar="EXPERIMENT:SWEEP:METHODS")
    ap.add_argument("--model", action="append", default=[], help="these models instead of the sweep's")
    ap.add_argument("--batch", type=int, default=256, help="the batch the jobs tune at (default 256)")
    ap.add_argument("--jobs", type=int, help="jobs at a time (default TUNE_JOBS, else the cores less two, <= 14)")
    ap.add_argument("--dry-run", action="store_true", help="interpreter, the sweeps' on_cpu models, fake timer")
    args = ap.parse_args(argv)
    per_set = [jobs_of(js, args.model, args.dry_run) for js in args.job_set]
    if args.dry_run:      # the interpreter takes seconds a candidate: one job of each set, the cheapest
        per_set = [[min(jobs, key=lambda j: WEIGHT.get(j.method, 1))] for jobs in per_set]
    return run_jobs([j for jobs in per_set for j in jobs], args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
