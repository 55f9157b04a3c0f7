"""The launch-config tuner's CPU dry run (experiments/tune.py, replayssm/tuning.py, replayssm/launch_table.py):
in the Triton interpreter (fp32, tiny Mamba-2 geometry, batch 2) with an injected timer that makes one known
candidate fastest, the tuner picks it, leaves every cache tensor bit-for-bit as it was, writes the table, and a
later kernel sweep launches the tuned config (rows: launch_source=tuned) with the default baseline beside it."""

from __future__ import annotations

import json

import pytest
import torch

from experiments import tune
from experiments.harness.entry import load_config
from experiments.harness.points import expand
from experiments.kernel.run import DEFAULT_SUFFIX, run_experiment
from replayssm import launch_registry, launch_table, tuning
from replayssm.checks import interpreter_active

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="runs the Triton kernels in the interpreter")

OVERRIDES = ["sweep=smoke", "sweep.on_cpu.backend=triton", "sweep.on_cpu.batch=[2]", "sweep.models=[tiny_mamba2]",
             "sweep.on_cpu.models=[tiny_mamba2]", "method.names=[baseline_ar]", "progress=false"]
WINNER = {"block_m": 8, "num_warps": 2}          # a candidate of mamba2_ssu_ar's space at headdim 16


@pytest.fixture
def tables(tmp_path, monkeypatch):
    directory = tmp_path / "tables"
    monkeypatch.setenv(launch_table.TABLE_ENV, str(directory))
    launch_table.reload()
    yield directory
    launch_table.reload()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equal (NaN-poisoned outputs included)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def winner_timer():
    """Fastest when the WINNER override is active; runs the call once (a real in-place step each time)."""
    def timer(fn):
        fn()
        return 0.5 if launch_table.active_override("mamba2_ssu_ar") == WINNER else 1.0
    return timer


def _baseline_phase():
    plan = expand(load_config("kernel_decode", OVERRIDES))
    (p,) = [p for p in plan.points if p.method == "baseline_ar"]
    (phase,) = tune.phases(p, plan, "cpu")
    return plan, p, phase


def test_dry_run_picks_the_fastest_keeps_the_state_and_a_sweep_uses_it(tables, tmp_path):
    plan, p, phase = _baseline_phase()
    before = [t.clone() for t in phase.touched]
    entries = tune.tune_phase(phase, p, {}, timer=winner_timer(), log=lambda *_: None)
    for t, b in zip(phase.touched, before):
        assert same_bits(t, b), "tuning changed a cache tensor"
    (key, entry), = entries["mamba2_ssu_ar"].items()
    assert key == "dstate=16,headdim=16|float32"
    assert entry["config"] == WINNER and entry["ms"] == 0.5 and entry["default_ms"] == 1.0
    assert entry["candidates"] == 12 and entry["rejected"] == 0

    path = launch_table.save("interpreter", entries, {"dry_run": True}, tables)
    assert path == tables / "interpreter.json"
    assert json.loads(path.read_text())["entries"]["mamba2_ssu_ar"][key]["config"] == WINNER

    result = run_experiment(load_config("kernel_decode", OVERRIDES + [f"out_dir={tmp_path / 'runs'}"]))
    by_source = {r["launch_source"]: r for r in result.rows}
    assert set(by_source) == {"tuned", "default"}, [r["launch_source"] for r in result.rows]
    tuned, default = by_source["tuned"], by_source["default"]
    assert tuned["status"] == default["status"] == "ok"
    assert tuned["launch_config"] == "mamba2_ssu_ar[block_m=8,block_n=16,num_warps=2]"
    assert default["launch_config"] == "mamba2_ssu_ar[block_m=16,block_n=16,num_warps=4]"
    assert default["config_hash"] == tuned["config_hash"] + DEFAULT_SUFFIX
    assert tuned["method"] == default["method"] == "baseline_ar"


def test_without_a_table_rows_say_default(tables, tmp_path):
    result = run_experiment(load_config("kernel_decode", OVERRIDES + [f"out_dir={tmp_path / 'runs'}"]))
    (row,) = result.rows
    assert row["launch_source"] == "default" and row["launch_config"].startswith("mamba2_ssu_ar[")


def test_a_candidate_with_wrong_output_is_rejected_and_the_state_kept(tables):
    _, _, phase = _baseline_phase()
    before = [t.clone() for t in phase.touched]
    bad = {"block_m": 4, "num_warps": 1}

    def wrong_under_bad():                          # a config that computes something else
        out = phase.call()
        return out.add_(1.0) if launch_table.active_override("mamba2_ssu_ar") == bad else out

    calls = []
    trials = tuning.tune("mamba2_ssu_ar", wrong_under_bad, phase.touched, [bad, WINNER],
                         timer=lambda fn: calls.append(fn()) or float(len(calls)))
    assert trials[0].is_default and trials[0].ms == 1.0
    assert trials[1].ms is None and "differs from the default config" in trials[1].error
    assert trials[2].ms == 2.0 and tuning.best(trials).config == WINNER
    for t, b in zip(phase.touched, before):
        assert same_bits(t, b), "a rejected trial changed a cache tensor"


def test_table_resolution_overrides_and_defaults(tables):
    from baselines.mamba2_ssu_kernels import launch_config

    default = launch_config(16, 16, torch.float32, "cpu")
    launch_table.save("interpreter", {"mamba2_ssu_ar": {"dstate=16,headdim=16|float32": {"config": WINNER}}}, {},
                      tables)
    with launch_table.record() as log:
        assert launch_config(16, 16, torch.float32, "cpu")[::2] == (8, 2)
        with launch_table.use_defaults():
            assert launch_config(16, 16, torch.float32, "cpu") == default
        with launch_table.override("mamba2_ssu_ar", {"num_warps": 1}):
            assert launch_config(16, 16, torch.float32, "cpu").num_warps == 1
        assert launch_config(16, 16, torch.float32, "cpu", "mamba2_ssu_spec") == default   # its own name
    assert [x.source for x in log] == ["tuned", "default", "override", "default"]
    assert launch_table.summarize(log[:1]) == ("tuned", "mamba2_ssu_ar[block_m=8,block_n=16,num_warps=2]")
    assert launch_table.summarize(log[:2])[0] == "mixed" and launch_table.summarize([])[0] == "n/a"
    # REPLAYSSM_LAUNCH_TABLES=off (GPU first contact) reads no table: the defaults, said as such
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(launch_table.TABLE_ENV, "off")
        with launch_table.record() as off:
            assert launch_config(16, 16, torch.float32, "cpu") == default
        assert [x.source for x in off] == ["default"] and not launch_table.has_table("interpreter")
    # an entry naming a field the config does not have is never launched
    launch_table.save("interpreter", {"mamba2_ssu_ar": {"dstate=16,headdim=16|float32": {"config": {"BV": 8}}}},
                      {}, tables)
    assert launch_config(16, 16, torch.float32, "cpu") == default


def test_every_space_fits_the_budget():
    geos = [{"headdim": 64, "dstate": 128, "K": 128, "V": 128, "window": 4, "L": 16}]
    for kernel in ("mamba2_ssu_ar", "mamba2_ssu_spec", "mamba2_cr_verify", "mamba2_cr_commit", "gdn_recurrent",
                   "gdn_spec_verify", "gdn_cr_verify", "gdn_cr_commit", "mamba2_replay_ar", "gdn_replay_ar",
                   "mamba2_replay_spec", "gdn_replay_spec", "mamba2_replay_tree", "gdn_replay_tree",
                   *(k for k, s in launch_registry.KERNELS.items() if s.family == "kda" and s.space is not None)):
        for g in geos:
            space = tune.candidates(kernel, g)
            assert 1 <= len(space) <= tune.MAX_CANDIDATES, kernel
    # the tree verify: the chain's tiles without the window padding (the tree launch ignores block_t)
    tree = tune.candidates("mamba2_replay_tree", geos[0])
    assert tree and all(c.block_t is None for c in tree)
    assert tree == [c for c in tune.candidates("mamba2_replay_spec", geos[0]) if c.block_t is None]
    assert tune.candidates("gdn_replay_tree", geos[0]) == tune.candidates("gdn_replay_spec", geos[0])
    for kernel in ("mamba2_spec_materialize", "gdn_spec_materialize", "kda_replay_materialize"):
        assert tune.candidates(kernel, geos[0]) == [], kernel
    # every dropped candidate (it spills in the AOT build) is a member of its raw space, and left out of it
    for kernel, route, fields in tune.TUNE_DROPPED:
        key = dict(geos[0], route=route) if route else geos[0]
        assert dict(fields) in tune.candidates(kernel, key, include_dropped=True), (kernel, fields)
        assert dict(fields) not in tune.candidates(kernel, key), (kernel, fields)


KDA = ["sweep=smoke", "sweep.on_cpu.backend=triton", "sweep.on_cpu.batch=[2]", "sweep.models=[tiny_kda]",
       "sweep.on_cpu.models=[tiny_kda]", "progress=false"]


def test_kda_points_tune_under_kda_names_and_never_read_a_gdn_entry(tables):
    """KDA launches GDN's kernels with PER_CHANNEL: every KDA launch resolves under its own kda_ declaration
    (replayssm/launch_registry.py: the GDN build's space less the kda_ drops of the AOT audit), and a gdn_ entry
    at the same key leaves a KDA launch alone."""
    gdn_build = {kda: gdn for gdn, kda in launch_registry.KDA_BUILD.items()}
    launches: dict[str, str] = {}
    for experiment in tune.EXPERIMENTS:
        ((plan, points),) = tune.plan_points([experiment], KDA, claims_only=False)
        assert points and {p.family for p in points} == {"kda"}
        for p in points:
            seen = set()
            for phase in tune.phases(p, plan, "cpu"):
                log, _ = tune.discover(phase)
                launches.update((x.kernel, x.key) for x in log)
                seen |= {x.kernel for x in log}
            assert not any(k.startswith("gdn_") for k in seen), seen
            assert set(tune.kernels_of(p)) <= seen, (p.method, seen)
    tunable = {k for k in launches if tune.candidates(k, _parsed(launches[k]))}
    assert {"kda_recurrent", "kda_replay_ar", "kda_spec_verify", "kda_cr_verify", "kda_cr_commit",
            "kda_replay_spec"} <= tunable
    for kernel in tunable:
        # the GDN twin's space, less the kda_ candidates the AOT audit saw spill (tune.audited_spills)
        twin, key = gdn_build[kernel], _parsed(launches[kernel])
        assert tune.candidates(kernel, key) == [c for c in tune.candidates(twin, key, include_dropped=True)
                                                if tune.dropped_reason(kernel, key, c) is None]
        assert all(k[0] != kernel or "triton" in why for k, why in tune.TUNE_DROPPED.items())

    # the dry run tunes a KDA AR point under kda_ names (state kept, as for every kernel)
    ((plan, points),) = tune.plan_points(["kernel_decode"], KDA + ["method.names=[baseline_ar]"], claims_only=False)
    (p,) = points
    (ar,) = tune.phases(p, plan, "cpu")
    before = [t.clone() for t in ar.touched]
    entries = tune.tune_phase(ar, p, {}, timer=tune.fake_timer(), log=lambda *_: None)
    assert set(entries) == {"kda_recurrent"}
    assert all(same_bits(t, b) for t, b in zip(ar.touched, before))

    # a GDN entry at every key a KDA launch resolves: the KDA launches keep their defaults
    gdn_entries = {gdn_build[k]: {key: {"config": {"num_warps": 1}}} for k, key in launches.items()}
    launch_table.save("interpreter", gdn_entries, {}, tables)
    resolved = []
    for experiment in tune.EXPERIMENTS:
        ((plan, points),) = tune.plan_points([experiment], KDA, claims_only=False)
        for p in points:
            for phase in tune.phases(p, plan, "cpu"):
                call = phase.call() if phase.name == "commit" else phase.call
                with launch_table.record() as log:
                    call()
                resolved += log
    assert {x.kernel for x in resolved} == set(launches)
    assert {x.source for x in resolved} == {"default"}, [(x.kernel, x.source) for x in resolved]
    # while the same entry under the kda_ name is the one a KDA launch takes
    launch_table.save("interpreter", {"kda_recurrent": entries["kda_recurrent"]}, {}, tables)
    with launch_table.record() as log:
        ar.call()
    assert [x.source for x in log] == ["tuned"] and log[0].kernel == "kda_recurrent"


def _parsed(entry_key: str) -> dict:
    return {k: int(v) if v.isdigit() else v for k, v in
            (part.split("=", 1) for part in entry_key.split("|")[0].split(","))}


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_a_tree_verify_is_tuned_state_safely_and_a_later_tree_verify_uses_it(tables, family):
    """The tree verify is tuned on the spec point's ring with a chain tree of spec_T nodes (tune.phases): the
    winner under its own name (<family>_replay_tree), every cache tensor kept, and a later tree verify on a
    fresh ring launches the tuned config."""
    kernel = f"{family}_replay_tree"
    overrides = ["sweep=smoke", "sweep.on_cpu.backend=triton", "sweep.on_cpu.batch=[2]",
                 f"sweep.models=[tiny_{family}]", f"sweep.on_cpu.models=[tiny_{family}]",
                 "method.names=[replay_spec]", "progress=false"]
    ((plan, points),) = tune.plan_points(["kernel_spec"], overrides, claims_only=False)
    p = points[0]
    (tree,) = [ph for ph in tune.phases(p, plan, "cpu") if ph.name == "tree_verify"]
    launches, _ = tune.discover(tree)
    (launch,) = [x for x in launches if x.kernel == kernel]
    key = dict(part.split("=") for part in launch.key.split("|")[0].split(","))
    space = tune.candidates(kernel, {k: int(v) for k, v in key.items()})
    assert 2 <= len(space) <= tune.MAX_CANDIDATES
    winner = launch_table.fields(space[-1])

    def timer(fn):
        fn()
        cand = launch_table.active_override(kernel)
        return 0.5 if cand is not None and launch_table.fields(cand) == winner else 1.0

    before = [t.clone() for t in tree.touched]
    entries = tune.tune_phase(tree, p, {}, timer=timer, log=lambda *_: None)
    for t, b in zip(tree.touched, before):
        assert same_bits(t, b), "tuning the tree verify changed a cache tensor"
    entry = entries[kernel][launch.key]
    assert entry["ms"] == 0.5 and entry["default_ms"] == 1.0 and entry["rejected"] == 0
    launch_table.save("interpreter", entries, {"dry_run": True}, tables)

    (later,) = [ph for ph in tune.phases(p, plan, "cpu", seed=1) if ph.name == "tree_verify"]
    with launch_table.record() as log:
        later.call()
    (used,) = [x for x in log if x.kernel == kernel]
    assert used.source == "tuned" and used.key == launch.key
    assert entry["config"] and used.config == launch_table.apply(launch.config, entry["config"])
    assert winner.items() <= used.config.items()            # the tuned winner, on top of the default rule
