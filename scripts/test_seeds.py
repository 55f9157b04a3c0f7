"""Run the test suite under several fresh seeds and print each seed with its result (`make test-seeds N=5`).

Every randomized test draws from REPLAYSSM_TEST_SEED (tests/conftest.py: the `gen` / `rng` fixtures and the
global torch, random and numpy generators, reseeded per test from the seed and the test id). One run of
`make test` checks one draw; this runs the same pytest command N times, each under a new seed from the
system's entropy (or under the seeds given, to replay them), keeps each run's whole output in a log, and
prints a table of seed -> counts -> verdict. Exit 1 when any seed failed: replay it with
`REPLAYSSM_TEST_SEED=<seed> make test`.

    python scripts/test_seeds.py -n 5                      # the whole suite, 5 fresh seeds
    python scripts/test_seeds.py --seeds 1037,1047 -- tests/replayssm/test_tree.py -k random
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

# The same pytest invocation as `make test` (Makefile), so a seed that passes here passes there.
DEFAULT_PYTEST = ["-n", "2", "--dist", "loadfile", "-q", "-p", "no:cacheprovider", "tests"]
# pytest's closing line: "1 failed, 1467 passed, 42 skipped in 273.06s (0:04:33)"
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def closing_counts(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line, e.g. {'passed': 1467, 'failed': 1}; {} if it has none."""
    for line in reversed(output.splitlines()):
        if " in " in line and COUNTS.search(line):
            return {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
                    for n, kind in COUNTS.findall(line)}
    return {}


def run_seed(seed: int, pytest_args: list[str], log: Path) -> tuple[int, dict[str, int], float]:
    """Run pytest under one seed; its whole output goes to `log`. Returns (exit code, counts, seconds)."""
    env = dict(os.environ, REPLAYSSM_TEST_SEED=str(seed), TRITON_INTERPRET="1")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    log.write_text(proc.stdout)
    return proc.returncode, closing_counts(proc.stdout), time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=5, help="how many fresh seeds (ignored with --seeds)")
    ap.add_argument("--seeds", help="comma-separated seeds to run instead of fresh ones (replay)")
    ap.add_argument("--log-dir", type=Path, default=Path(".test-seeds"), help="one log per seed goes here")
    ap.add_argument("pytest_args", nargs="*",
                    help=f"after --: pytest's arguments (default: {' '.join(DEFAULT_PYTEST)})")
    args = ap.parse_args()
    seeds = ([int(s) for s in args.seeds.split(",")] if args.seeds
             else [random.SystemRandom().randrange(2**31) for _ in range(args.n)])
    pytest_args = args.pytest_args or DEFAULT_PYTEST
    out = args.log_dir / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    print(f"test-seeds: {len(seeds)} runs of pytest {' '.join(pytest_args)}; logs in {out}", flush=True)
    failed = []
    for i, seed in enumerate(seeds, 1):
        rc, counts, secs = run_seed(seed, pytest_args, out / f"seed-{seed}.log")
        # pytest exit 0 = all passed; 5 = nothing collected, which is no evidence either way.
        verdict = "PASS" if rc == 0 else f"FAIL (exit {rc})"
        if rc != 0:
            failed.append(seed)
        shown = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no summary line"
        print(f"[{i}/{len(seeds)}] REPLAYSSM_TEST_SEED={seed:<10d}  {verdict:<14s} {shown}  ({secs:.0f} s)",
              flush=True)
    print(f"test-seeds: {len(seeds) - len(failed)} of {len(seeds)} seeds passed"
          + (f"; replay a failure with REPLAYSSM_TEST_SEED=<seed> make test (failed: {failed})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
