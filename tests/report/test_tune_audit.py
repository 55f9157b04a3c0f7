"""The KDA launch-tuning spaces (experiments/tune.py) against their AOT audit (experiments/tune_audit.json,
experiments/report/kernels/tune_audit.py): every candidate at Kimi-Linear's geometry is in the record for sm_90 and
sm_100, no candidate the tuner would time spills in any recorded Triton version, every spilling one is dropped
with its reason; and a child process rebuilds two record entries (the listed candidate with the most registers,
and a dropped one) to hold the record to the installed compiler. A full audit is ~200 builds (2 minutes with a
warm Triton cache, 15 cold): the record caches it, two builds check it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import tune
from replayssm import launch_table
from replayssm.geometry import get_geometry

ROOT = Path(__file__).resolve().parents[2]
GEOMETRY = "kimi_linear_48b_a3b"
RECORD = json.loads(tune.TUNE_AUDIT.read_text())
KDA_KERNELS = sorted({k for (method, family), kernels in tune.KERNELS_OF.items() if family == "kda" for k in kernels})


def _key() -> dict:
    g = get_geometry(GEOMETRY)
    return {"K": g.K, "V": g.V}                   # all a kda_ space reads (its GDN twin's: BV / BKT / block_v fit)


def _entries(version: str) -> dict:
    return RECORD[version][GEOMETRY]


def test_every_kda_candidate_is_audited_and_none_the_tuner_times_spills():
    assert RECORD and KDA_KERNELS
    for version in RECORD:
        entries = _entries(version)
        for kernel in KDA_KERNELS:
            listed = [launch_table.config_label(c) for c in tune.candidates(kernel, _key())]
            everything = [launch_table.config_label(c) for c in tune.candidates(kernel, _key(), include_dropped=True)]
            assert listed, kernel
            for label in everything:
                targets = entries[kernel][label]               # KeyError: a candidate the audit never built
                assert set(targets) == {"sm_90", "sm_100"}, (version, kernel, label)
                spills = any(spill for _, spill in targets.values())
                assert (label in listed) != spills, (version, kernel, label, targets)
            for label in set(everything) - set(listed):         # dropped, and the reason says where it spilled
                fields = tuple(next(c for c in tune.candidates(kernel, _key(), include_dropped=True)
                                    if launch_table.config_label(c) == label).items())
                assert "spills" in tune.TUNE_DROPPED[(kernel, None, fields)], (kernel, label)


def test_the_defaults_are_in_the_space_and_do_not_spill():
    """What the tuner compares every candidate with (each kernel's default launch config at Kimi-Linear) builds
    without spills in the record too, where it is a member of the space."""
    entries = _entries(max(RECORD))
    clean = {k: {label for label, t in entries[k].items() if not any(s for _, s in t.values())} for k in KDA_KERNELS}
    assert all(clean.values())
    # the KDA tree verify's default ([16, 16] tiles at 8 warps, replayssm/gdn/spec_kernels.py) is audited clean
    assert "BV=16,BKT=16,num_warps=8" in clean["kda_replay_tree"]


def _rebuild(pairs: list[tuple[str, str]]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # a real compile, no interpreter
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    code = ("import json, sys; from experiments.report.kernels.tune_audit import audit, triton_version; "
            f"r = audit({GEOMETRY!r}, [90], 'kda', only={set(pairs)!r}, log=lambda s: None); "
            "print(json.dumps({'version': triton_version(), 'result': r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_record_matches_the_compiler():
    version = max(RECORD)
    entries = _entries(version)
    listed = {k: {launch_table.config_label(c) for c in tune.candidates(k, _key())} for k in KDA_KERNELS}
    edge = max(((t["sm_90"][0], k, label) for k in KDA_KERNELS for label, t in entries[k].items()
                if label in listed[k]))[1:]
    dropped = min(((t["sm_90"][1], k, label) for k in KDA_KERNELS for label, t in entries[k].items()
                   if t["sm_90"][1]))[1:]
    got = _rebuild([edge, dropped])
    built = {(k, label): targets["sm_90"] for k, configs in got["result"].items() for label, targets in configs.items()}
    assert set(built) == {edge, dropped}, built
    assert built[edge][1] == 0, f"{edge} is listed but spills {built[edge][1]} B under triton {got['version']}"
    if got["version"] in RECORD:                     # the compiler the record was made with: the same build
        assert built[edge] == _entries(got["version"])[edge[0]][edge[1]]["sm_90"]
        assert built[dropped] == _entries(got["version"])[dropped[0]][dropped[1]]["sm_90"]
