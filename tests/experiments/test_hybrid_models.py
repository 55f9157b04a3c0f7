"""The five production models in experiments/hybrid: their configs are accepted (none refused), NVFP4 weight
bytes, vLLM's hybrid allocator reproduces PR #47576's concurrency table, the step's analytic bytes agree with
the kernel rows' byte model, the CPU caps and `model=` are honoured, and a composed block built with an SSM
stack counts each SSM layer once. Analytic or tiny; no production-sized model is built."""

import dataclasses

import pytest
import torch
import yaml

from experiments.harness.methods import REGISTRY
from experiments.harness.points import CONF_DIR, load_model_config
from experiments.hybrid import footprint as fpm
from experiments.hybrid.layers import SSMCall
from experiments.hybrid.run import compose, model_override
from experiments.hybrid.spec import hybrid_spec
from experiments.hybrid.sweep import HybridPoint, expand

PRODUCTION = ["nemotron3_nano_4b", "qwen35_4b", "nemotron3_super_120b", "qwen35_122b_a10b", "nemotron3_ultra_550b"]
OPTIONS = {"B": "16", "T": "4", "max_model_len": "2048", "gpu_memory_utilization": "0.9",
           "max_num_batched_tokens": "8192", "activation_reserve_gb": "", "tp": "", "weights": "checkpoint"}


def _cfg(tmp_path, experiment, **sweep):
    base = dict(models=[f"{m}@tp8" for m in PRODUCTION], batch=[2], context_len=[16], spec_T=[4], history_len=6,
                methods=["baseline_ar", "replay_ar"], modes=["ar", "native", "replayssm", "commit_replay"],
                route="output_only",
                acceptance=[{"kind": "rate", "p": 0.7}], spec_steps=4, state_dtype="float32", act_dtype="float32",
                backend="torch", build="auto", max_build_bytes=10**8, max_model_len=256, vocab_cap=512,
                expert_cap=32, hbm_fallback_bytes=10**11)
    base.update(sweep)
    return {"sweep": base, "device": "cpu", "seed": 0, "out_dir": str(tmp_path), "progress": False,
            "timing": {"l2_factor": 4, "max_layers": 64}, "experiment": {"name": experiment}}


@pytest.mark.parametrize("experiment", ["e2e_decode", "serving"])
def test_no_production_model_is_refused(tmp_path, experiment):
    plan = expand(_cfg(tmp_path, experiment), experiment, {"name": "cpu", "l2_bytes": 32 * 2**20})
    assert {p.model for p in plan.points} == set(PRODUCTION)
    assert all(p.build == "block" and p.ssm_copies == 1 for p in plan.points)       # CPU: one mixer per block
    super_full, super_cpu = plan.full_specs["nemotron3_super_120b@tp8"], plan.specs["nemotron3_super_120b@tp8"]
    assert super_full.mlp.num_experts == 512 and super_cpu.mlp.num_experts == 32 and super_full.vocab == 16384
    assert any("expert_cap" in a for a in super_cpu.assumed) and any("vocab_cap" in a for a in super_cpu.assumed)
    counts = super_full.counts
    assert (counts["M"], counts["E"], counts["*"]) == (40, 40, 8) and super_full.mlp.latent == 1024


def test_expert_cap_below_top_k_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"sweep.expert_cap=16: below .* top-k 22"):
        expand(_cfg(tmp_path, "e2e_decode", expert_cap=16), "e2e_decode", {"name": "cpu"})


def test_model_override_keeps_the_sweeps_own_entry():
    data = {"sweep": {"models": ["tiny_gdn", "nemotron3_super_120b@tp8"]}}
    assert model_override(data, ["model=nemotron3_super_120b"])["sweep"]["models"] == ["nemotron3_super_120b@tp8"]
    assert model_override(data, ["model=qwen35_4b"])["sweep"]["models"] == ["qwen35_4b@tp8"]
    assert model_override({"sweep": {"models": ["tiny_gdn"]}}, ["model=qwen35_4b"])["sweep"]["models"] == ["qwen35_4b"]
    assert model_override(data, ["model=qwen35_4b", "sweep.models=[tiny_gdn]"]) is data
    assert model_override(data, ["sweep.batch=[1]"]) is data


def test_nvfp4_weights_are_half_a_byte_plus_a_scale_per_16():
    spec = hybrid_spec(load_model_config("nemotron3_super_120b"))
    params = fpm.model_weights(spec, with_mtp=True)
    linear = sum(n for k, n in params.items() if k in fpm.LINEAR_KINDS and k not in spec.bf16_kinds)
    other = sum(params.values()) - linear
    assert fpm.weight_bytes(spec, params, "nvfp4") == int(linear * 0.5625 + other * 2)
    kept = dataclasses.replace(spec, bf16_kinds=spec.bf16_kinds + ("experts",))
    grown = fpm.weight_bytes(kept, params, "nvfp4") - fpm.weight_bytes(spec, params, "nvfp4")
    assert abs(grown - params["experts"] * (2 - 0.5625)) <= 2
    assert 110e9 < sum(params.values()) < 135e9                      # "120B" (MTP layer included)
    assert fpm.weight_bytes(spec, params, "bfloat16") == 2 * sum(params.values())


def test_vllm_allocator_reproduces_pr47576_within_15_percent():
    b300 = yaml.safe_load((CONF_DIR / "hardware" / "b300.yaml").read_text())
    rows = fpm.concurrency_table(list(fpm.PUBLISHED_CONCURRENCY), b300, OPTIONS)
    assert len(rows) == 4
    for r in rows:
        assert 0.85 <= r["vllm/published"] <= 1.15, r
    plan = {(r["model"], r["mode"]): r for r in rows}
    assert plan[("nemotron3_super_120b", "native")]["groups"] == "1x* + 5xSSM of 9"     # 8 + MTP attention
    assert plan[("nemotron3_super_120b", "native")]["blocks/req"] == 1 + 5 * 4          # T states per SSM group
    assert plan[("qwen35_122b_a10b", "replayssm")]["blocks/req"] == 1 + 3
    other = fpm.concurrency_table(["qwen35_122b_a10b"], b300, {**OPTIONS, "T": "6"})     # not PR #47576's T
    assert all(r["published"] is None for r in other) and other[0]["blocks/req"] == 1 + 3 * 6


def test_step_bytes_ssm_term_is_the_kernel_byte_model():
    spec = hybrid_spec(load_model_config("tiny_gdn"))
    call = SSMCall("gdn", "torch", spec.geometry, torch.float32, torch.float32, spec_T=3, history_len=4)
    counts = torch.randint(1, 4, (8, 5), generator=torch.Generator().manual_seed(0))
    got = fpm.step_bytes(spec, "replay_spec", call, batch=5, context_len=32, T=3, counts=counts, with_mtp=True)
    per_seq = REGISTRY["replay_spec"].traffic(call, call, counts).total
    assert got["bytes_ssm"] == pytest.approx(per_seq * 5 * spec.ssm_layers)
    assert got["bytes_step"] == pytest.approx(got["bytes_weights"] + got["bytes_kv"] + got["bytes_ssm"])
    assert 0 < got["ssm_byte_share"] < 1
    assert fpm.experts_touched(512, 22, 1) == pytest.approx(22) and fpm.experts_touched(512, 22, 10**4) <= 512


def test_composed_step_counts_each_ssm_layer_once_with_a_stack():
    spec = hybrid_spec(load_model_config("tiny_mamba2"))
    point = HybridPoint(experiment="e2e_decode", model=spec.name, tp=1, family="mamba2", method="baseline_ar",
                        mode=None, batch=1, context_len=8, buffer_len=None, history_len=None, spec_T=None,
                        acceptance=None, route=None, state_dtype="float32", act_dtype="float32", backend="torch",
                        build="block", device="cpu", seed=0, ssm_copies=4)
    assert spec.block(4).count("M") == 4 and spec.block(4).count("*") == 1
    # 4 built mixers of 2 us each are one SSM layer of 2 us, weighted by the pattern's 3 SSM layers
    prof = {("verify", "M"): 8.0, ("verify", "*"): 1.0, ("verify", "-"): 1.0, ("commit", "M"): 0.0,
            ("verify", "other"): 1.0}
    got = compose(spec, point, step_us=11.0, prof=prof)
    assert got["ssm_us"] == pytest.approx(3 * 2.0) and got["attention_us"] == pytest.approx(1.0)
    assert got["mlp_us"] == pytest.approx(2 * 1.0) and got["verify_us"] + got["commit_us"] == pytest.approx(
        got["median_us"])
