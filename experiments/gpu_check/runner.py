"""Run a stage set: every command a subprocess in its own process group, killed at the stage's limit, each
stage recorded in stages.tsv and OUT packed after it (so a call killed later keeps what finished).

Statuses in stages.tsv: ok; timeout (the group was killed at the limit: SIGTERM, SIGKILL GRACE_S later);
failed(rc=N); skipped-gpu (--dry-run: a GPU-only stage, its commands printed); or the note a stage wrote to
$GPU_CHECK_NOTE when it stopped short on purpose with exit 10 (`budget: N not started`, `partial: plots
cut`), which is no failure. A failed or killed stage that had noted something keeps both. The next stage
runs whatever happened; the exit code is 1 if any stage failed or timed out.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from experiments.gpu_check.stages import GRACE_S, ROOT, Cmd, Ctx, Stage, StageSet, stages_of

TIMEOUT_RC = 124             # what `timeout` returned: the summaries and tests read it so
PARTIAL_RC = 10              # a stage that stopped short on purpose (scripts/gpu/gpu_check_testlog.py's BUDGET_EXIT)
GPU_ENV = ("TRITON_INTERPRET=0", "REPLAYSSM_TEST_DEVICE=cuda")    # what a run sets that a dry run does not
ENV_KEYS = ("gpu_name", "torch", "triton", "cuda", "copy_GBps", "driver", "git_commit", "git_dirty", "stack_note")


def tested_stack(env: dict) -> str:
    """The torch/Triton pair make test-gpu-stack tests (constraints-gpustack.txt's `# gpu-box:` line)."""
    if env.get("TESTED_STACK"):
        return env["TESTED_STACK"]
    path = ROOT / "constraints-gpustack.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("# gpu-box:")), "")


def new_launchers(since: float) -> int:
    """Triton 3.6.0's C launchers (one gcc build per kernel signature) built since `since`: the figure that
    sizes a stage's limit after first contact (3.7 builds none)."""
    cache = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    count = 0
    for dirpath, _, files in os.walk(cache):
        for f in files:
            if f.startswith("__triton_launcher") and f.endswith(".so"):
                try:
                    count += os.path.getmtime(os.path.join(dirpath, f)) >= since
                except OSError:
                    pass
    return count


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_cmd(cmd: Cmd, env: dict, deadline: float, log) -> int:
    """Run one command in a new process group, its output tee'd to stdout and `log`; at `deadline` the group
    gets SIGTERM, GRACE_S later SIGKILL (-> TIMEOUT_RC). Anything it left running in its group is killed."""
    proc = subprocess.Popen(cmd.argv, cwd=ROOT, env={**env, **cmd.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)

    def tee():
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace")
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
            log.flush()
    reader = threading.Thread(target=tee, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
        rc = TIMEOUT_RC
    _kill_group(proc.pid, signal.SIGKILL)          # grandchildren that outlived the leader hold the pipe
    reader.join(timeout=5)
    return rc


class Runner:
    def __init__(self, stage_set: StageSet, ctx: Ctx):
        self.set, self.ctx = stage_set, ctx
        self.stages = stages_of(stage_set, ctx.env)
        self.failed: list[str] = []
        self.gpu_only: list[str] = []              # --dry-run: the GPU commands not run here
        self.mode = "dry-run" if ctx.dry else "run"

    # ------------------------------------------------------------------------------ the environment
    def stage_env(self, stage: Stage, deadline: float) -> dict:
        ctx = self.ctx
        env = dict(ctx.env, PYTHONHASHSEED="0", TRITON_INTERPRET="0", PYTHONUNBUFFERED="1",
                   TESTED_STACK=tested_stack(ctx.env), GPU_CHECK_STAGE_DEADLINE=f"{deadline:.3f}",
                   GPU_CHECK_NOTE=str(ctx.work / "stage.note"))
        if ctx.dry:                # a dry run: no CUDA test device (the CPU sweeps time the torch backend)
            env.pop("REPLAYSSM_TEST_DEVICE", None)
        else:
            env["REPLAYSSM_TEST_DEVICE"] = "cuda"
        paths = [str(ROOT), str(ROOT / "scripts" / "gpu")]
        if ctx.site.is_dir():      # the wheels stage's offline install: imported first by every later stage
            paths.insert(0, str(ctx.site))
        env["PYTHONPATH"] = ":".join(paths + ([ctx.env["PYTHONPATH"]] if ctx.env.get("PYTHONPATH") else []))
        if self.set.launch_tables:
            env["REPLAYSSM_LAUNCH_TABLES"] = self.set.launch_tables.format(work=ctx.work)
        return env

    # ------------------------------------------------------------------------------------ the stages
    def run(self) -> int:
        ctx = self.ctx
        for d in (ctx.out, ctx.work / "logs", ctx.work / "results"):
            d.mkdir(parents=True, exist_ok=True)
        (ctx.out / "stages.tsv").write_text("stage\tstatus\tseconds\tlimit_s\tlaunchers\n")
        for stage in self.stages:
            if stage.when(ctx):
                self.run_stage(stage)
            else:                              # the wheels stage without a bundle: the box's own packages
                print(f"\n==== [{stage.name}] not run: its condition does not hold ({stage.what})")
        self.pack()
        if self.gpu_only:
            print("\n==== dry run: GPU commands skipped here (run them on the GPU box: "
                  f"python -m experiments.gpu_check --set {self.set.name} OUT)")
            print("\n".join(f"  {c}" for c in self.gpu_only))
        print(f"\n==== summary ({ctx.out / 'summary.txt'})")
        print((ctx.out / "summary.txt").read_text(), end="")
        print("files: " + " ".join(sorted(p.name for p in ctx.out.iterdir())))
        if self.failed:
            print(f"FAILED: {' '.join(self.failed)}")
            return 1
        print("all stages passed")
        return 0

    def _record(self, name: str, status: str, seconds: int, limit: int, launchers: int) -> None:
        with open(self.ctx.out / "stages.tsv", "a") as f:
            f.write(f"{name}\t{status}\t{seconds}\t{limit}\t{launchers}\n")

    def run_stage(self, stage: Stage) -> str:
        ctx, limit = self.ctx, stage.limit(self.ctx)
        if ctx.dry:                            # the GPU's commands as they would run there, environment included
            gpu = [" ".join([*GPU_ENV, *(f"{k}={v}" for k, v in c.env.items()), *c.argv])
                   for c in (step(ctx) for step in stage.steps)]
            if stage.dry is None:              # GPU only: printed and recorded, nothing run
                self.gpu_only += [f"[{stage.name}] {c}" for c in gpu]
                print(f"\n==== [{stage.name}] skipped (needs a GPU): {' ; '.join(gpu)}")
                self._record(stage.name, "skipped-gpu", 0, 0, 0)
                return "skipped-gpu"
            if stage.dry is not stage.steps:   # a CPU form of the stage: the GPU's commands are said too
                self.gpu_only += [f"[{stage.name}] {c}" for c in gpu]
        steps = stage.dry if ctx.dry else stage.steps
        note = ctx.work / "stage.note"
        note.unlink(missing_ok=True)
        t0 = time.time()
        deadline = t0 + limit
        env = self.stage_env(stage, deadline)
        rc = 0
        with open(ctx.out / "stage.log", "w") as log:
            head = f"\n==== [{stage.name}] limit {limit}s: {stage.what}\n"
            sys.stdout.write(head)
            log.write(head)
            for step in steps:
                cmd = step(ctx)
                line = f"$ {' '.join(cmd.argv)}\n"
                sys.stdout.write(line)
                log.write(line)
                log.flush()
                rc = run_cmd(cmd, env, deadline, log)
                if rc != 0:
                    break
        noted = note.read_text().strip() if note.is_file() else ""
        if rc == 0:
            status = "ok"
        elif rc == PARTIAL_RC:
            status = noted or "partial"
        else:
            status = "timeout" if rc in (TIMEOUT_RC, -signal.SIGKILL, 137) else f"failed(rc={rc})"
            if noted:                           # a failure or kill in a stage that noted something: both
                status = f"{status}; {noted}"
            self.failed.append(f"{stage.name}:{status}")
        shutil.move(str(ctx.out / "stage.log"), ctx.work / "logs" / f"{stage.name}.log")
        self._record(stage.name, status, round(time.time() - t0), limit, new_launchers(t0))
        self.pack()
        return status

    # ------------------------------------------------------------------------------------- packing
    def pack(self) -> None:
        """OUT's files from WORK, after every stage: tarballs written beside and renamed into place."""
        ctx = self.ctx
        work, out = ctx.work, ctx.out
        members = [n for n in ("results", "tables", "ncu", "pytest.xml", "launch_floor.json") if (work / n).exists()]
        members += sorted(p.name for p in work.glob("*.ncu.txt"))
        if members:
            _tar(out / "results.tar.gz", work, members)
        _tar(out / "logs.tar.gz", work, ["logs"])
        for name in self.set.loose:
            src = work / name
            if name == "launch_table.json":     # the tuned table, under its device's name in WORK/tables
                src = next(iter(sorted((work / "tables").glob("*.json"))), src)
            if src.is_file():
                shutil.copyfile(src, out / name)
        (out / "summary.txt").write_text(self.summary())

    def summary(self) -> str:
        ctx = self.ctx
        lines = [f"gpu_check {self.set.name} {ctx.run_id} ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}), "
                 f"mode {self.mode}"]
        lines += _columns([r.split("\t") for r in (ctx.out / "stages.tsv").read_text().splitlines()])
        env_json = ctx.work / "env.json"
        if env_json.is_file():
            info = json.loads(env_json.read_text())
            flat = {**info, **(info.get("nvml") if isinstance(info.get("nvml"), dict) else {}),
                    **info.get("modules", {}), **(info.get("git") or {})}
            lines += [f"  {k}: {flat[k]}" for k in ENV_KEYS if k in flat]
        floor = ctx.work / "launch_floor.csv"
        if floor.is_file():
            with open(floor) as f:
                rows = [r for r in csv.DictReader(f) if r.get("status") == "ok"]
            lines.append("launch floor (ms per call, batch 1):")
            lines += [f"  {r['name']:<36} {r['mode']:<6} {float(r['ms_median']):9.4f}" for r in rows]
        tests_log = ctx.out / "tests.log"
        if tests_log.is_file():
            lines.append(tests_line(tests_log.read_text()))
        run_dir = ctx.run_dir()
        if run_dir and (run_dir / "REPORT.md").is_file():
            lines += [ln for ln in (run_dir / "REPORT.md").read_text().splitlines() if ln.startswith("|")]
        if (ctx.work / "dram.csv").is_file():
            with open(ctx.work / "dram.csv") as f:
                lines += ["", *_columns(list(csv.reader(f)))]
        if (ctx.work / "kernel_table.md").is_file():
            lines += ["", (ctx.work / "kernel_table.md").read_text().rstrip()]
        lines += [f"skipped (GPU): {c}" for c in self.gpu_only]
        return "\n".join(lines) + "\n"


def tests_line(text: str) -> str:
    """`tests: P passed, F failed, S skipped, N not started (budget)` from the plugin's per-test log."""
    ends = [ln.split("\t")[1] for ln in text.splitlines() if ln.count("\t") >= 2]
    left = [ln.split(": ")[1].split()[0] for ln in text.splitlines() if ln.startswith("# time budget")]
    return (f"tests: {ends.count('passed')} passed, {ends.count('failed')} failed, {ends.count('skipped')} skipped, "
            f"{left[-1] if left else 0} not started (budget)")


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max((len(r) for r in rows), default=0))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _tar(path: Path, root: Path, members: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for m in members:
            tar.add(root / m, arcname=m)
    os.replace(tmp, path)
