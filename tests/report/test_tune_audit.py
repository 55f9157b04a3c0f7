"""The KDA launch-tuning spaces (experiments/tune.py) against their AOT audit (experiments/tune_audit.json,
experiments/report/kernels/tune_audit.py): every candidate at Kimi-Linear's geometry is in the record for sm_90 and
sm_100 under both Triton versions this project runs (the CPU environment's, constraints-cpu.txt, and the GPU box's,
constraints-gpustack.txt), route by route for the route-keyed kda_replay_ar; no candidate the tuner would time
spills in any recorded version, every dropped one spills in one of them (with its reason); and a child process
rebuilds two record entries (the listed candidate with the most registers, and a dropped one) to hold the record
to the installed compiler. A full audit is ~250 builds per version (2 minutes with a warm Triton cache, 15 cold):
the record caches it, two builds check it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import tune
from replayssm import launch_registry, launch_table
from replayssm.checks import FAMILY_ROUTES
from replayssm.geometry import get_geometry

ROOT = Path(__file__).resolve().parents[2]
GEOMETRY = "kimi_linear_48b_a3b"
RECORD = json.loads(tune.TUNE_AUDIT.read_text())
KDA_KERNELS = sorted(k for k, s in launch_registry.KERNELS.items()          # the tuned kda_ declarations
                     if s.family == "kda" and s.space is not None and s.launched_by)
ROUTED = {"kda_replay_ar"}            # launch config keyed by the step's route (tune.static_key): audited per route


def _pinned(constraints: str) -> str:
    """The triton version a constraints file pins (triton==X)."""
    (version,) = re.findall(r"^triton==(\S+)", (ROOT / constraints).read_text(), re.M)
    return version


VERSIONS = sorted({_pinned("constraints-cpu.txt"), _pinned("constraints-gpustack.txt")})


def _key(route: str | None = None) -> dict:
    g = get_geometry(GEOMETRY)
    key = {"K": g.K, "V": g.V}            # all a kda_ space reads (its GDN twin's: BV / BKT / block_v fit)
    return key if route is None else key | {"route": route}


def _routes(kernel: str) -> list[str]:
    """The routes whose step launches a route-keyed kernel (its declaration's launched_by), in FAMILY_ROUTES order."""
    spec = launch_registry.spec(kernel)
    return [r for r in FAMILY_ROUTES["kda"] if spec.launched("replay_ar", r)]


def _names() -> list[tuple[str, str, dict]]:
    """(record name, kernel, tuner key) of every audited space: kernel, or kernel[route] per route."""
    return [(f"{k}[{r}]" if r else k, k, _key(r)) for k in KDA_KERNELS
            for r in (_routes(k) if k in ROUTED else [None])]


def _entries(version: str) -> dict:
    return RECORD[version][GEOMETRY]


def _labels(kernel: str, key: dict, include_dropped: bool = False) -> list[str]:
    return [launch_table.config_label(c) for c in tune.candidates(kernel, key, include_dropped=include_dropped)]


def test_both_triton_versions_are_recorded_and_nothing_else():
    assert VERSIONS == ["3.6.0", "3.7.1"]                    # the pins this record was made for
    assert sorted(RECORD) == VERSIONS, "re-run experiments/report/kernels/tune_audit.py --write under each"
    for version in VERSIONS:
        assert sorted(_entries(version)) == sorted(name for name, _, _ in _names()), version


def test_every_kda_candidate_is_audited_and_none_the_tuner_times_spills():
    assert RECORD and KDA_KERNELS
    for name, kernel, key in _names():
        listed, everything = _labels(kernel, key), _labels(kernel, key, include_dropped=True)
        assert listed, name
        for label in everything:
            spills = []
            for version in VERSIONS:
                targets = _entries(version)[name][label]   # KeyError: a candidate the audit never built
                assert set(targets) == {"sm_90", "sm_100"}, (version, name, label)
                spills += [(version, t) for t, (_, spill) in targets.items() if spill]
            assert (label in listed) != bool(spills), (name, label, spills)   # dropped exactly when it spills
        for label in set(everything) - set(listed):         # dropped, and the reason says where it spilled
            cand = next(c for c in tune.candidates(kernel, key, include_dropped=True)
                        if launch_table.config_label(c) == label)
            assert "spills" in tune.dropped_reason(kernel, key, cand), (name, label)


def test_the_defaults_are_in_the_space_and_do_not_spill():
    """What the tuner compares every candidate with (each kernel's default launch config at Kimi-Linear) builds
    without spills in every recorded version too, where it is a member of the space."""
    for version in VERSIONS:
        entries = _entries(version)
        clean = {n: {label for label, t in entries[n].items() if not any(s for _, s in t.values())}
                 for n, _, _ in _names()}
        assert all(clean.values()), version
        # the KDA tree verify's default ([16, 16] tiles at 8 warps, replayssm/gdn/spec_kernels.py) is audited clean
        assert "BV=16,BKT=16,num_warps=8" in clean["kda_replay_tree"], version


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
    import triton

    version = triton.__version__ if triton.__version__ in RECORD else VERSIONS[-1]
    entries = _entries(version)
    listed = {name: set(_labels(kernel, key)) for name, kernel, key in _names()}
    edge = max(((t["sm_90"][0], n, label) for n in listed for label, t in entries[n].items()
                if label in listed[n]))[1:]
    dropped = min(((t["sm_90"][1], n, label) for n in listed for label, t in entries[n].items()
                   if t["sm_90"][1]))[1:]
    got = _rebuild([edge, dropped])
    built = {(k, label): targets["sm_90"] for k, configs in got["result"].items() for label, targets in configs.items()}
    assert set(built) == {edge, dropped}, built
    assert built[edge][1] == 0, f"{edge} is listed but spills {built[edge][1]} B under triton {got['version']}"
    if got["version"] in RECORD:                     # the compiler the record was made with: the same build
        assert built[edge] == _entries(got["version"])[edge[0]][edge[1]]["sm_90"]
        assert built[dropped] == _entries(got["version"])[dropped[0]][dropped[1]]["sm_90"]
