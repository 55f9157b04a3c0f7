"""python -m experiments.gpu_check [--set S] [--plan | --dry-run] [OUT_DIR] [--model M ...]

--plan prints the set's stages with their limits and `total: N s` (each limit plus the kill grace and the
packing) and runs nothing; --dry-run runs every stage's CPU-safe commands here and prints the GPU commands it
does not run; with neither, the GPU commands (on the GPU box). The package docstring has the rest.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from experiments.gpu_check.runner import Runner
from experiments.gpu_check.stages import BUDGET_S, GRACE_S, PACK_S, ROOT, SETS, Ctx, plan_total, stages_of


def wheels_dir(env: dict) -> Path | None:
    """WHEELS=DIR (`none`: no wheels stage); unset: ./gpu_wheels where the call carried one."""
    given = env.get("WHEELS")
    if given is not None:
        return None if given.strip().lower() in ("", "none") else Path(given).resolve()
    default = ROOT / "gpu_wheels"
    return default if (default / "MANIFEST.tsv").is_file() else None


def plan(ctx: Ctx) -> int:
    stage_set = SETS[ctx.set_name]
    stages = stages_of(stage_set, ctx.env)
    print(f"{'stage':<9} {'limit_s':>8}  what")
    for s in stages:
        print(f"{s.name:<9} {s.limit(ctx):>8}  {s.what}")
    for s in stages:
        if s.note:
            print(s.note)
    print(f"(each stage: its limit + {GRACE_S} s kill grace + {PACK_S} s packing; budget {BUDGET_S} s: one "
          f"10-minute device command with start-up and transfers)")
    print(f"total: {plan_total(stages, ctx)} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="gpu_check", choices=list(SETS), help="the stage set (default gpu_check)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="print the stages, their limits and the total")
    mode.add_argument("--dry-run", action="store_true", help="the CPU-safe form of every stage, here")
    ap.add_argument("out", nargs="?", type=Path, help="OUT_DIR: at most 8 files come back from it")
    ap.add_argument("--model", action="append", default=[], help="tune_check: the models to tune (repeatable)")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    stage_set = SETS[args.set]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    ctx = Ctx(set_name=args.set, out=(args.out or Path("OUT")).resolve(), work=Path("WORK"),
              py=env.get("PY") or sys.executable, run_id=f"{args.set.replace('_', '-')}-{stamp}", dry=args.dry_run,
              wheels=wheels_dir(env), models=args.model, env=env)
    try:
        stages_of(stage_set, env)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    if args.plan:
        return plan(ctx)
    if args.out is None:
        ap.error("OUT_DIR is required (usage: python -m experiments.gpu_check [--set S] [--plan | --dry-run] "
                 "OUT_DIR)")
    ctx.work = Path(env.get("WORK") or tempfile.mkdtemp(prefix=f"{args.set}.")).resolve()
    return Runner(stage_set, ctx).run()


if __name__ == "__main__":
    sys.exit(main())
