"""Sweep expansion and validation: every bad config fails before any work with a message naming the key."""

from __future__ import annotations

import pytest
import torch
from harness_doubles import compose
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from experiments.harness import points
from experiments.harness.acceptance import parse_acceptance
from experiments.harness.entry import load_config
from experiments.harness.methods import REGISTRY
from experiments.harness.points import CONF_DIR, expand, known_models, load_model_config, model_spec
from replayssm.geometry import get_geometry


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def test_cpu_sweep_expands_to_every_method_of_each_kind(tmp_path):
    plan = expand(compose(tmp_path, "kernel_decode"))
    methods = {(p.model, p.method, p.route) for p in plan.points}
    assert ("tiny_mamba2", "baseline_ar", None) in methods
    assert ("tiny_mamba2", "replay_ar", "output_only") in methods
    assert ("tiny_mamba2", "replay_ar", "state_and_output") in methods
    assert ("tiny_gdn", "replay_ar", "output_only") in methods
    # GDN's state-and-output route is a Triton kernel form: the C kernels (backend cpu) compute output-only
    assert ("tiny_gdn", "replay_ar", "state_and_output") not in methods
    triton = expand(compose(tmp_path, "kernel_decode", ["sweep.backend=triton"]))
    assert {("tiny_gdn", "output_only"), ("tiny_gdn", "state_and_output")} <= {
        (p.model, p.route) for p in triton.points if p.method == "replay_ar"}
    assert ("tiny_gdn", "peer:mamba_ssm", None) not in methods          # family filter
    assert not any(p.method.endswith("_spec") for p in plan.points)     # decode runs AR methods only
    baseline = next(p for p in plan.points if p.method == "baseline_ar")
    assert baseline.buffer_len is None and baseline.route is None and baseline.backend == "cpu"

    spec = expand(compose(tmp_path, "kernel_spec", ["sweep.acceptance=[rate:0.5,fixed:all]"]))
    kinds = {(p.method, p.acceptance) for p in spec.points}
    assert {("replay_spec", "rate:0.5"), ("replay_spec", "fixed:all"), ("baseline_ar", None)} <= kinds
    assert all(p.history_len == 3 for p in spec.points if p.method == "replay_spec")
    assert all(p.history_len is None for p in spec.points if p.method == "baseline_spec")
    assert sum(p.method == "baseline_ar" for p in spec.points) == 2       # once per model: the reference


def test_paper_sweep_on_a_model_group_choice(monkeypatch):
    # The paper grid is a GPU grid: pretend there is a device so it validates here.
    monkeypatch.setattr(points, "resolve_device", lambda device: "cuda")
    cfg = load_config("kernel_decode", ["model=nemotron3_super_120b", "sweep=paper"])
    plan = expand(cfg)
    assert {p.model for p in plan.points} == {"nemotron3_super_120b"}
    batches = sorted({p.batch for p in plan.points})
    assert batches == [2 ** i for i in range(10)]
    replay = [p for p in plan.points if p.method == "replay_ar"]
    assert len(replay) == 10 * 4 * 2 and {p.buffer_len for p in replay} == {4, 8, 16, 32}
    assert {p.timing_mode for p in plan.points} == {"graph"} and {p.l2 for p in plan.points} == {"cold"}
    spec = expand(load_config("kernel_spec", ["model=qwen35_122b_a10b", "sweep=paper"]))
    assert {p.spec_T for p in spec.points if p.spec_T} == {2, 4, 6, 8}
    with pytest.raises(ValueError, match="sweep.timing_mode=graph with backend=torch"):
        expand(load_config("kernel_decode", ["sweep=paper", "sweep.backend=torch"]))
    with pytest.raises(ValueError, match="sweep.torch_compile"):
        expand(load_config("kernel_decode", ["sweep=paper", "sweep.torch_compile=true"]))


def test_tp_split_and_config_hash(tmp_path):
    plan = expand(compose(tmp_path, overrides=["sweep.models=[nemotron3_super_120b@tp8]"]))
    spec = plan.models["nemotron3_super_120b@tp8"]
    assert spec.geometry == get_geometry("nemotron3_super_120b", 8)
    hashes = [p.config_hash() for p in plan.points]
    assert len(set(hashes)) == len(hashes)
    assert hashes == [p.config_hash() for p in expand(compose(tmp_path, overrides=[
        "sweep.models=[nemotron3_super_120b@tp8]"])).points]                 # stable across expansions


def test_model_configs_agree_with_geometry_and_cite_sources():
    names = known_models()
    assert {"nemotron3_nano_4b", "nemotron3_super_120b", "nemotron3_ultra_550b", "qwen35_4b", "qwen35_122b_a10b",
            "tiny_mamba2", "tiny_gdn", "tiny_kda", "kimi_linear_48b_a3b", "qwen3_next_80b_a3b",
            "nemotron3_nano_30b_a3b"} <= set(names)
    for name in names:
        cfg = load_model_config(name)
        spec = model_spec(cfg, None)                       # raises if geometry disagrees with replayssm.geometry
        layers = cfg["layers"]
        assert layers["ssm"] + layers["attention"] <= layers["total"], name
        if layers.get("pattern"):
            assert sum(layers["pattern"].count(c) for c in "MGK") == layers["ssm"], name
        assert spec.family in ("mamba2", "gdn", "kda")
        if not name.startswith("tiny"):
            assert "Sources" in (CONF_DIR / "model" / f"{name}.yaml").read_text(), name


def test_hardware_profiles_hold_the_datasheet_peaks():
    names = ("h100", "h200", "b200", "b300")
    cfgs = {n: OmegaConf.load(CONF_DIR / "hardware" / f"{n}.yaml") for n in names}
    assert {n: c.peak_hbm_TBps for n, c in cfgs.items()} == {"h100": 3.35, "h200": 4.8, "b200": 8.0, "b300": 8.0}
    # HBM capacity (decimal GB, the datasheets): the analytic concurrency budget of experiments.hybrid.footprint
    assert {n: c.hbm_bytes for n, c in cfgs.items()} == {"h100": 80e9, "h200": 141e9, "b200": 192e9, "b300": 288e9}


@pytest.mark.parametrize("override, key", [
    (["sweep.models=[no_such_model]"], "model"),
    (["method.names=[baseline_ar,warp_drive]"], "method.names[1]"),
    (["sweep.batch=[2,0]"], "sweep.batch[1]"),
    (["sweep.batch=[2,-4]"], "sweep.batch[1]"),
    (["sweep.batch=[x]"], "sweep.batch[0]"),
    (["sweep.buffer_len=[4.5]"], "sweep.buffer_len[0]"),
    (["sweep.state_dtype=[float8]"], "sweep.state_dtype[0]"),
    (["sweep.backend=torch", "sweep.state_dtype=[bfloat16]"], "sweep.state_dtype"),  # bf16 torch not timed
    (["sweep.backend=torch", "sweep.act_dtype=[bfloat16]"], "sweep.act_dtype"),      # (backend=cpu has bf16)
    (["sweep.routes=[output_only,sideways]"], "sweep.routes[1]"),
    (["sweep.backend=cuda_graphs"], "sweep.backend"),
    (["sweep.timing_mode=graph"], "sweep.timing_mode"),                   # graphs need a GPU
    (["sweep.l2=tepid"], "sweep.l2"),                                    # (cold runs on CPU since issue 10)
    (["sweep.torch_compile=maybe"], "sweep.torch_compile"),
    (["sweep.models=[nemotron3_super_120b@tp3]"], "sweep.models[0].tp"),
    (["sweep.models=[tiny_mamba2@tpX]"], "sweep.models[0]"),
    (["sweep.threads=0"], "sweep.threads"),
    (["sweep.slot_layout=shuffled"], "sweep.slot_layout"),
    (["timing.cpu_clock=sundial"], "timing.cpu_clock"),
])
def test_bad_decode_configs_name_the_key(tmp_path, override, key):
    _assert_invalid(tmp_path, "kernel_decode", override, key.replace("[", r"\[").replace("]", r"\]"))


def _assert_invalid(tmp_path, experiment: str, override: list[str], pattern: str) -> None:
    """A wrong type or a misspelt key fails while Hydra composes (the schema); the rest in expand."""
    try:
        cfg = compose(tmp_path, experiment, override)
    except ConfigCompositionException as exc:
        assert override[-1].split("=")[0] in str(exc)
        return
    with pytest.raises(ValueError, match=pattern):
        expand(cfg)


@pytest.mark.parametrize("override, key", [
    (["sweep.history_len=[3]", "sweep.spec_T=[4]"], "sweep.history_len"),      # B < T
    (["sweep.acceptance=[{kind: rate, p: -0.1}]"], "sweep.acceptance[0].p"),
    (["sweep.acceptance=[{kind: rate, p: 1.5}]"], "sweep.acceptance[0].p"),
    (["sweep.acceptance=[{kind: fixed, accepted: 0}]"], "sweep.acceptance[0].accepted"),
    (["sweep.acceptance=[{kind: table, table: [0.9, -1]}]"], r"sweep.acceptance\[0\].table\[1\]"),
    (["sweep.acceptance=[{kind: oracle}]"], "sweep.acceptance[0].kind"),
    (["sweep.acceptance=[]"], "sweep.acceptance"),
    (["sweep.spec_T=[0]"], "sweep.spec_T[0]"),
    (["method.names=[replay_ar]", "experiment.reference_methods=[]"], "method.names"),   # no spec method left
])
def test_bad_spec_configs_name_the_key(tmp_path, override, key):
    pattern = key if "\\" in key else key.replace("[", r"\[").replace("]", r"\]")
    _assert_invalid(tmp_path, "kernel_spec", override, pattern)


def test_schema_rejects_misspelt_keys_and_wrong_types_while_composing(tmp_path):
    for override in (["sweep.bacth=[1]"], ["sweep.batch=[x]"], ["sweep.threads=two"], ["hardware.peak_hbm_TBps=fast"]):
        with pytest.raises(ConfigCompositionException, match=override[0].split("=")[0]):
            compose(tmp_path, "kernel_decode", override)


def test_plain_dict_configs_are_validated_too(tmp_path):
    cfg = _plain(compose(tmp_path))
    cfg["sweep"]["batch"] = [1, True]                                       # a bool is not a batch size
    with pytest.raises(ValueError, match=r"sweep.batch\[1\]"):
        expand(cfg)
    cfg = _plain(compose(tmp_path))
    cfg["device"] = "tpu"
    with pytest.raises(ValueError, match="device"):
        expand(cfg)
    cfg = _plain(compose(tmp_path))
    cfg["sweep"]["bacth"] = [1]
    with pytest.raises(ValueError, match="sweep.bacth"):
        expand(cfg)
    cfg = _plain(compose(tmp_path))
    cfg["sweep"]["buffer_len"] = [4.5]
    with pytest.raises(ValueError, match=r"sweep.buffer_len\[0\]"):
        expand(cfg)


def test_acceptance_models():
    gen = torch.Generator().manual_seed(0)
    fixed = parse_acceptance({"kind": "fixed", "accepted": 3})
    assert fixed.label == "fixed:3" and fixed.expected(2) == 2.0             # clamped to T
    assert (fixed.sample(4, 5, 7, gen) == 3).all()
    rate = parse_acceptance("rate:0.5")
    counts = rate.sample(4, 4000, 1, gen)
    assert counts.min() >= 1 and counts.max() <= 4
    assert abs(counts.float().mean().item() - rate.expected(4)) < 0.05      # 1 + .5 + .25 + .125
    assert rate.expected(4) == pytest.approx(1.875)
    table = parse_acceptance({"kind": "table", "table": [1.0, 0.0]})
    assert (table.sample(4, 10, 3, gen) == 2).all() and table.label == "table:1/0"
    assert parse_acceptance("fixed:all").sample(3, 2, 2, gen).eq(3).all()
    again = parse_acceptance("rate:0.5").sample(4, 8, 8, torch.Generator().manual_seed(1))
    assert torch.equal(again, parse_acceptance("rate:0.5").sample(4, 8, 8, torch.Generator().manual_seed(1)))


def test_single_route_sweeps_run_a_route_the_backend_has():
    """sweep.route (accuracy, e2e_decode, serving) goes through Method.route_for: Mamba-2 keeps the requested
    route everywhere; GDN / KDA keep it on Triton and run output_only elsewhere (their torch and C forms);
    methods without routes get None."""
    replay, baseline = REGISTRY["replay_ar"], REGISTRY["baseline_ar"]
    assert replay.route_for("mamba2", "cpu", "state_and_output") == "state_and_output"
    for family in ("gdn", "kda"):
        assert replay.route_for(family, "triton", "state_and_output") == "state_and_output"
        assert replay.route_for(family, "cpu", "state_and_output") == "output_only"
        assert replay.route_for(family, "torch", "output_only") == "output_only"
    assert baseline.route_for("gdn", "triton", "output_only") is None
    assert REGISTRY["replay_spec"].route_for("mamba2", "cpu", "output_only") is None
