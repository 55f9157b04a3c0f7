"""The session seed reaches every place a failing run is read from, so `REPLAYSSM_TEST_SEED=<n> make test`
replays it: `-q` under xdist (where the header is hidden), the failing test's own message and report, and the
same draws again under the same seed. Runs this suite's conftest in a scratch pytest session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
FAILING = '''
import torch

def test_draws_and_fails(gen):
    x = torch.randn(4, generator=gen)
    y = torch.randn(2)                                   # the global generator: reseeded per test too
    print("DRAWN", [round(v, 6) for v in x.tolist() + y.tolist()])
    assert False, "deliberate failure"

def test_passes():
    assert True
'''


def _run(tmp_path: Path, seed: int | None, *args: str) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_scratch.py").write_text(FAILING)
    env = {k: v for k, v in os.environ.items() if k not in ("REPLAYSSM_TEST_SEED", "PYTEST_XDIST_WORKER")}
    env.update(CI="true", TRITON_INTERPRET="1")         # CI: pytest leaves the FAILED line uncut
    if seed is not None:
        env["REPLAYSSM_TEST_SEED"] = str(seed)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr          # exactly the deliberate failure
    return proc.stdout


@pytest.mark.parametrize("args", [("-q", "-n", "2"), ("-q",)], ids=["xdist-q", "q"])
def test_a_failing_run_names_its_seed(tmp_path, args):
    out = _run(tmp_path, None, *args)
    seeds = set(re.findall(r"REPLAYSSM_TEST_SEED=(\d+)", out))
    assert len(seeds) == 1, out                                      # one seed, named consistently
    seed = seeds.pop()
    assert re.search(rf"^replayssm: REPLAYSSM_TEST_SEED={seed} \(replay: ", out, re.M), out   # summary line
    assert re.search(rf"^FAILED .*test_draws_and_fails - \[REPLAYSSM_TEST_SEED={seed}\] ", out, re.M), out
    assert "replayssm seed" in out, out                              # the failure's own report section


def test_a_seed_replays_the_same_draws(tmp_path):
    drawn = [re.findall(r"DRAWN \[.*\]", _run(tmp_path, seed, "-q")) for seed in (11, 11, 12)]
    assert drawn[0] and drawn[0] == drawn[1], drawn
    assert drawn[0] != drawn[2], drawn
