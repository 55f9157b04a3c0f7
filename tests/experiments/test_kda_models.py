"""The hybrids added with the KDA family (issue 25): Kimi-Linear-48B-A3B (KDA + MLA), Qwen3-Next-80B-A3B (GDN)
and Nemotron-3-Nano-30B-A3B (Mamba-2) from their configs; the MLA layer's compressed cache and its decode
against a float64 hand computation; the footprint table. Analytic or tiny; no production-sized model is built."""

import math

import pytest
import torch
import yaml
from harness_doubles import scheduled_drafts

from experiments.harness.points import CONF_DIR, load_model_config, model_spec
from experiments.hybrid import footprint as fpm
from experiments.hybrid.generate import greedy_ar, greedy_speculative
from experiments.hybrid.layers import SSMCall, SSMMixer
from experiments.hybrid.mla import MLAAttention
from experiments.hybrid.model import HybridModel
from experiments.hybrid.spec import SSM_CHAR, hybrid_spec
from replayssm import geometry

NEW = ["qwen3_next_80b_a3b", "nemotron3_nano_30b_a3b"]
# every key the e2e step and the footprint read (dotted paths), present in each new config with a value or null
KEYS = ["name", "hf_id", "family", "geometry", "tp", "has_z", "dt_softplus", "use_qk_l2norm", "hidden_size",
        "layers.total", "layers.ssm", "layers.attention", "layers.mlp", "layers.pattern", "attention.num_heads",
        "mlp.kind", "mlp.act", "mlp.num_experts", "mlp.experts_per_token", "mlp.moe_intermediate_size",
        "mlp.shared_expert_intermediate_size", "vocab_size", "conv_kernel", "mtp.pattern", "replayssm.buffer_len",
        "replayssm.history_len", "weights.dtype", "assumed"]
# the values the sources give (conf/model comments name each source)
EXPECTED = {
    "qwen3_next_80b_a3b": dict(hidden=2048, counts={"G": 36, "*": 12, "E": 48}, heads=(16, 2, 256), experts=(512, 10),
                               expert_width=512, shared=512, vocab=151936),
    "nemotron3_nano_30b_a3b": dict(hidden=2688, counts={"M": 23, "*": 6, "E": 23}, heads=(32, 2, 128),
                                   experts=(128, 6), expert_width=1856, shared=3712, vocab=131072),
}


def _get(cfg: dict, path: str):
    node = cfg
    for part in path.split("."):
        assert isinstance(node, dict) and part in node, f"{cfg['name']}: {path} missing"
        node = node[part]
    return node


@pytest.mark.parametrize("name", NEW)
def test_new_configs_load_with_every_key_and_the_sourced_values(name):
    cfg = load_model_config(name)
    for key in KEYS:
        _get(cfg, key)
    text = (CONF_DIR / "model" / f"{name}.yaml").read_text()
    assert "Sources" in text and "[HF-" in text
    spec = hybrid_spec(cfg)
    table = geometry.GDN_MODELS if spec.family == "gdn" else geometry.MAMBA2_MODELS
    assert spec.geometry == table[name] == model_spec(cfg, None).geometry
    want = EXPECTED[name]
    assert spec.hidden == want["hidden"] and spec.vocab == want["vocab"]
    assert {k: spec.counts[k] for k in want["counts"]} == want["counts"]
    assert len(spec.pattern) == sum(want["counts"].values()) and spec.pattern.count(SSM_CHAR[spec.family])
    a, m = spec.attention, spec.mlp
    assert (a.num_heads, a.num_kv_heads, a.head_dim) == want["heads"] and a.kind == "gqa"
    assert (m.num_experts, m.top_k, m.expert_intermediate, m.shared_intermediate) == (
        *want["experts"], want["expert_width"], want["shared"])
    assert set(spec.assumed) <= {"mtp.pattern"}


def test_new_models_split_for_tp8():
    qn = hybrid_spec(load_model_config("qwen3_next_80b_a3b"), 8)
    assert (qn.geometry.H, qn.geometry.HV, qn.attention.num_heads, qn.attention.num_kv_heads) == (2, 4, 2, 1)
    nn = hybrid_spec(load_model_config("nemotron3_nano_30b_a3b"), 8)
    assert (nn.geometry.nheads, nn.geometry.ngroups, nn.mlp.expert_intermediate) == (8, 1, 232)


# ------------------------------------------------------------------------------------------------------- MLA

def _mla_spec(**over):
    cfg = load_model_config("tiny_gdn")
    cfg["attention"] = dict(kind="mla", num_heads=2, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
                            qk_rope_head_dim=8, v_head_dim=12, use_rope=False, **over)
    return hybrid_spec(cfg)


def _hand_mla(lay, h, lengths):
    """Un-absorbed MLA in float64: per head k = [c W_uk^T, k_pe], v = c W_uv^T over the cache up to each token."""
    a = lay.a
    r, nope = a.kv_lora_rank, a.qk_nope_head_dim
    b, T, _ = h.shape
    out = torch.empty(b, T, lay.w_out.shape[0], dtype=torch.float64)
    for i in range(b):
        for t in range(T):
            n = int(lengths[i]) + t + 1                      # causal: the cache up to and including token t
            c, k_pe = lay.cache[i, :n, :r], lay.cache[i, :n, r:]
            x = h[i, t]
            if lay.w_qa is not None:
                x = torch.nn.functional.rms_norm(lay.w_qa @ x, (a.q_lora_rank,), lay.q_norm, 1e-5)
            q = (lay.w_q @ x).reshape(a.num_heads, -1)
            heads = []
            for hd in range(a.num_heads):
                scores = (c @ lay.w_uk[hd].T @ q[hd, :nope] + k_pe @ q[hd, nope:]) / math.sqrt(a.head_dim)
                heads.append(torch.softmax(scores, 0) @ (c @ lay.w_uv[hd].T))
            out[i, t] = lay.w_out @ torch.cat(heads)
    return out


@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_mla_step_matches_a_float64_hand_computation(q_lora_rank):
    cfg = load_model_config("tiny_gdn")
    cfg["attention"] = dict(kind="mla", num_heads=2, q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_nope_head_dim=8,
                            qk_rope_head_dim=8, v_head_dim=12)
    spec = hybrid_spec(cfg)
    gen = torch.Generator().manual_seed(3)
    lengths, bound = torch.tensor([5, 3, 6]), [6]                 # desynchronised rows; bound = the max cursor
    lay = MLAAttention(spec, 3, 12, lengths, bound, gen, torch.float64, "cpu")
    lay.reset(gen, 6)
    for T in (1, 3):                                             # a decode step, then a verify window
        h = torch.randn(3, T, spec.hidden, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(lay(h), _hand_mla(lay, h, lengths), rtol=1e-10, atol=1e-12)
    # the window's entries sit at each row's cursor (row 1 at 3..5), nothing is written past the window
    assert lay.cache[1, 6:].abs().sum() == 0 and lay.cache[2, 9:].abs().sum() == 0
    r = spec.attention.kv_lora_rank                                # the latent part is stored normed
    torch.testing.assert_close(lay.cache[0, :8, :r].pow(2).mean(-1), torch.ones(8, dtype=torch.float64), atol=1e-3,
                               rtol=0)                        # rms_norm eps 1e-5


def test_mla_cache_bytes_are_latent_plus_rope_per_token():
    spec = _mla_spec()
    a = spec.attention
    assert a.kv_token_elems == 16 + 8
    lay = MLAAttention(spec, 3, 12, torch.zeros(3, dtype=torch.long), [0], torch.Generator(), torch.bfloat16, "cpu")
    assert lay.nbytes() == 3 * 12 * (16 + 8) * 2
    assert lay.weight_bytes() == fpm.layer_weights(spec, "*")["attention"] * 2 + 16 * 2    # + the latent's norm
    fp = fpm.footprint(spec, "ar", act_dtype=torch.bfloat16, state_dtype=torch.float32, max_model_len=100)
    assert fp.kv_per_seq == spec.attention_layers * 100 * 24 * 2
    with pytest.raises(ValueError, match="attention.kind"):
        cfg = load_model_config("tiny_gdn")
        cfg["attention"]["kind"] = "sparse"
        hybrid_spec(cfg)


def test_mla_tp_splits_heads_and_keeps_the_latent_whole():
    cfg = load_model_config("tiny_gdn")
    cfg["attention"] = dict(kind="mla", num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                            v_head_dim=12)
    a = hybrid_spec(cfg, 2).attention
    assert (a.num_heads, a.kv_lora_rank, a.kv_token_elems) == (2, 16, 24)


# ------------------------------------------------------------------------------------------------ footprint

def test_the_concurrency_table_lists_the_new_models():
    assert {"kimi_linear_48b_a3b", *NEW} <= set(fpm.TABLE_MODELS)
    b300 = yaml.safe_load((CONF_DIR / "hardware" / "b300.yaml").read_text())
    options = {"B": "16", "T": "4", "max_model_len": "2048", "gpu_memory_utilization": "0.9",
               "max_num_batched_tokens": "8192", "activation_reserve_gb": "", "tp": "", "weights": "checkpoint"}
    rows = fpm.concurrency_table(NEW, b300, options)
    assert [(r["model"], r["mode"]) for r in rows] == [(m, mode) for m in NEW for mode in ("native", "replayssm")]
    for r in rows:
        assert r["published"] is None and r["weight_format"] == "bfloat16" and r["vllm"] > 0
        assert r["mode"] == "native" or r["ratio_vllm"] > 1.5            # ReplaySSM's smaller SSM cache
    weights = {r["model"]: r["weights_GB"] for r in rows}
    assert 150 < weights["qwen3_next_80b_a3b"] < 175 and 60 < weights["nemotron3_nano_30b_a3b"] < 70   # bf16


@pytest.mark.parametrize("method", ["baseline_spec", "replay_spec"])
def test_a_model_with_mla_attention_verifies_and_rolls_back_as_ar(method, gen):
    """A tiny GDN hybrid with MLA attention: greedy speculative decoding (drafts the AR continuation, wrong
    from a scheduled position on, so windows accept 1..T and rejected latent entries must be rolled back)
    emits the AR tokens."""
    spec, T, n, batch = _mla_spec(), 3, 12, 2
    seed = int(torch.randint(0, 2**30, (1,), generator=gen))

    def build(m, window=None):
        call = SSMCall(spec.family, "torch", spec.geometry, torch.float32, torch.float32, buffer_len=spec.buffer_len,
                       spec_T=window, history_len=spec.history_len)
        model = HybridModel(spec, ssm_method=m, call=call, num_slots=batch, capacity=20 + 2 * n * T,
                            gen=torch.Generator().manual_seed(seed), device="cpu")
        model.reset(20, torch.Generator().manual_seed(seed + 1))
        return model

    tok0 = torch.randint(0, spec.vocab, (batch,), generator=gen)
    ar = greedy_ar(build("baseline_ar"), tok0, n + T)
    done = torch.zeros(batch, dtype=torch.long)

    windows = []

    def drafter(token, hidden, k):                    # rejections scheduled: every count 1..T in 2 windows
        windows.append(k)
        return scheduled_drafts(ar, done, k, len(windows) - 1, spec.vocab, gen)

    model = build(method, T)
    assert isinstance(next(lay for ch, _, lay in model.layers if ch == "*"), MLAAttention)
    out, history = greedy_speculative(model, drafter, tok0, torch.zeros(batch, spec.hidden), n, T,
                                      on_commit=lambda acc: done.add_(acc.long()))
    assert torch.equal(out, ar[:, :n]) and set(torch.cat(history).tolist()) == set(range(1, T + 1))
    assert model.cache_bytes()["kv"] == model.num_slots * model.capacity * 24 * 4


# ------------------------------------------------------------------------------------- Kimi-Linear (KDA)

def test_kimi_linear_config_is_the_released_one():
    cfg = load_model_config("kimi_linear_48b_a3b")
    for key in KEYS:
        _get(cfg, key)
    assert "[HF-KL]" in (CONF_DIR / "model" / "kimi_linear_48b_a3b.yaml").read_text()
    spec = hybrid_spec(cfg)
    assert spec.family == "kda" and spec.geometry == geometry.KDA_MODELS["kimi_linear_48b_a3b"]
    assert spec.geometry == model_spec(cfg, None).geometry
    c = spec.counts
    assert (c["K"], c["*"], c["E"], c["-"], len(spec.pattern)) == (20, 7, 26, 1, 54)
    full = [i + 1 for i, ch in enumerate(spec.pattern[0::2]) if ch == "*"]           # 1-based decoder layers
    assert full == [4, 8, 12, 16, 20, 24, 27] and spec.pattern[1] == "-"          # first_k_dense_replace 1
    a, m = spec.attention, spec.mlp
    assert (a.kind, a.num_heads, a.kv_lora_rank, a.qk_rope_head_dim, a.qk_nope_head_dim, a.v_head_dim) == (
        "mla", 32, 512, 64, 128, 128)
    assert a.q_lora_rank is None and a.use_rope is False and a.kv_token_elems == 576
    assert (m.num_experts, m.top_k, m.expert_intermediate, m.shared_intermediate, m.intermediate) == (
        256, 8, 1024, 1024, 9216)
    assert (spec.hidden, spec.vocab, spec.conv_kernel, spec.assumed) == (2304, 163840, 4, ("mtp.pattern",))
    tp8 = hybrid_spec(cfg, 8)
    assert (tp8.geometry.H, tp8.geometry.HV, tp8.attention.num_heads, tp8.attention.kv_token_elems) == (4, 4, 4, 576)
    params = sum(fpm.model_weights(spec, with_mtp=False).values())
    assert 47e9 < params < 51e9                                        # "48B" (49.1B in the released index)
    tiny = hybrid_spec(load_model_config("tiny_kda"))
    assert tiny.family == "kda" and tiny.attention.kind == "mla" and set(tiny.pattern) == set("K-E*")


def _kda_call(spec, method, window=None, act=torch.float32):
    return SSMCall("kda", "torch", spec.geometry, torch.float32, act, route="state_and_output",
                   buffer_len=spec.buffer_len, spec_T=window, history_len=spec.history_len)


def test_kda_mixer_matches_a_float64_hand_computation(gen):
    """The KDA layer wiring: per-key-channel decay from the low-rank leg + dt_bias, beta, q/k/v through the conv,
    the recurrence (replayssm.kda.ref), the per-head norm and the sigmoid output gate, then out_proj."""
    from replayssm.kda.decode import materialize
    from replayssm.kda.ref import kda_step_ref

    F = torch.nn.functional
    spec = hybrid_spec(load_model_config("tiny_kda"))
    g, b = spec.geometry, 3
    layer = SSMMixer(spec, "replay_ar", _kda_call(spec, "replay_ar"), b, torch.Generator().manual_seed(5), "cpu")
    layer.reset(torch.Generator().manual_seed(6))
    for _ in range(spec.buffer_len + 2):                                 # across a flush
        h = torch.randn(b, 1, spec.hidden, generator=gen)
        state = materialize(layer.cache, backend="torch").double()
        conv_state = layer.conv_state.clone()
        got = layer(h)
        proj = (h.double() @ layer.w_in.double().T)[:, 0]
        qkv, f_a, beta_raw, g_a = torch.split(proj, layer.split, dim=-1)
        window = torch.cat([conv_state[:, :, :].double(), qkv[:, None]], dim=1)          # [b, K, conv_dim]
        qkv = F.silu((window * layer.conv_w.double().T[None]).sum(1) + layer.conv_b.double())
        q, k, v = torch.split(qkv, [g.H * g.K, g.H * g.K, g.HV * g.V], dim=-1)
        f = (f_a @ layer.w_fb.double().T).reshape(b, g.HV, g.K) + layer.dt_bias.double().reshape(g.HV, g.K)
        decay = -torch.exp(layer.A_log.double())[:, None] * F.softplus(f)
        _, o, _ = kda_step_ref(state, q.reshape(b, g.H, g.K), k.reshape(b, g.H, g.K), v.reshape(b, g.HV, g.V),
                               decay, torch.sigmoid(beta_raw), None, True)
        y = F.rms_norm(o, (g.V,), None, 1e-5).reshape(b, -1) * layer.norm_w.double()
        want = (y * torch.sigmoid(g_a @ layer.w_gb.double().T)) @ layer.w_out.double().T
        torch.testing.assert_close(got[:, 0].double(), want, rtol=2e-4, atol=2e-5)
        layer.advance(torch.ones(b, dtype=torch.int32))
    assert decay.std(-1).min() > 0                                       # the decay really differs per channel


def test_kimi_like_tiny_model_speculates_exactly_as_it_decodes(gen):
    """tiny_kda (KDA mixers, an MLA layer, dense MLP and MoE): greedy speculative decoding on the ReplaySSM ring
    with rejected drafts emits the tokens of AR decoding on the ReplaySSM buffer (two code paths of replayssm.kda,
    the MLA cache rolled back by its cursor)."""
    spec, T, n, batch = hybrid_spec(load_model_config("tiny_kda")), 3, 12, 2
    seed = int(torch.randint(0, 2**30, (1,), generator=gen))

    def build(m, window=None):
        model = HybridModel(spec, ssm_method=m, call=_kda_call(spec, m, window), num_slots=batch,
                            capacity=20 + 2 * n * T, gen=torch.Generator().manual_seed(seed), device="cpu")
        model.reset(20, torch.Generator().manual_seed(seed + 1))
        return model

    tok0 = torch.randint(0, spec.vocab, (batch,), generator=gen)
    ar = greedy_ar(build("replay_ar"), tok0, n + T)
    done = torch.zeros(batch, dtype=torch.long)

    windows = []

    def drafter(token, hidden, k):                    # rejections scheduled: every count 1..T in 2 windows
        windows.append(k)
        return scheduled_drafts(ar, done, k, len(windows) - 1, spec.vocab, gen)

    out, history = greedy_speculative(build("replay_spec", T), drafter, tok0, torch.zeros(batch, spec.hidden), n, T,
                                      on_commit=lambda acc: done.add_(acc.long()))
    assert torch.equal(out, ar[:, :n]) and set(torch.cat(history).tolist()) == set(range(1, T + 1))


@pytest.mark.parametrize("experiment", ["kernel_decode", "kernel_spec"])
def test_kimi_linear_runs_through_the_kernel_experiments(tmp_path, experiment):
    from harness_doubles import FAST

    from experiments.harness.entry import load_config
    from experiments.kernel.run import run_experiment

    models = "sweep.models=[tiny_kda,kimi_linear_48b_a3b@tp8]"
    overrides = [f"out_dir={tmp_path}", "sweep=cpu", models, "sweep.batch=[2]", "sweep.buffer_len=[3]",
                 "sweep.spec_T=[2]", "sweep.history_len=[3]", "sweep.l2=warm", *FAST]
    cfg = load_config(experiment, overrides)
    rows = run_experiment(cfg).rows
    ours = "replay_ar" if experiment == "kernel_decode" else "replay_spec"
    ok = {(r["model"], r["method"]) for r in rows if r["status"] == "ok"}
    assert {("tiny_kda", ours), ("kimi_linear_48b_a3b", ours)} <= ok, [(r["method"], r["message"]) for r in rows]
    for r in rows:
        assert r["family"] == "kda" and r["status"] in ("ok", "skipped"), r
        if r["status"] == "ok":
            assert "gate passed" in r["message"] and r["rel_err"] < 1e-5
            if r["method"].startswith("peer:"):       # FLA's Triton KDA kernel: checked under the interpreter
                assert r["backend"] == "triton" and r["median_us"] is None
            else:                                      # backend=cpu: KDA on GDN's C kernels (per-channel mode)
                assert r["backend"] == "cpu" and r["median_us"] > 0 and r["bytes_model"] > 0
        else:
            assert "needs a CUDA device" in r["message"], r           # a Triton peer without the interpreter
    assert {m for _, m in ok} >= ({"baseline_ar", "replay_ar"} if experiment == "kernel_decode" else
                                  {"baseline_spec", "commit_replay_spec", "replay_spec"})


@pytest.mark.parametrize("experiment", ["e2e_decode", "serving"])
def test_kimi_linear_runs_through_the_whole_model_experiments(tmp_path, experiment):
    """tiny_kda built whole and Kimi-Linear at TP8 composed from one block (KDA, MLA, dense MLP, MoE), with
    sweep.backend=cpu: KDA's mixers run GDN's C kernels in per-channel mode; ok rows for AR and ReplaySSM."""
    from experiments.hybrid.run import run_hybrid

    sweep = dict(models=["tiny_kda", "kimi_linear_48b_a3b@tp8"], batch=[2], context_len=[16],
                 methods=["baseline_ar", "replay_ar"], modes=["ar", "native", "replayssm", "commit_replay"],
                 spec_T=[3], history_len=6, acceptance=[{"kind": "rate", "p": 0.7}], spec_steps=4,
                 route="output_only", state_dtype="float32", act_dtype="float32", backend="cpu", build="auto",
                 max_build_bytes=10**8, max_model_len=256, vocab_cap=512, expert_cap=8, hbm_fallback_bytes=10**11,
                 hbm_util=0.9, cpu_repeats=1, cpu_warmup=0, threads=1)
    cfg = {"sweep": sweep, "device": "cpu", "seed": 0, "out_dir": str(tmp_path), "progress": False,
           "timing": {"cpu_clock": "auto", "warmup_ms": 1, "rep_ms": 1, "l2_factor": 4, "max_layers": 64},
           "hardware": {"name": "cpu"}, "experiment": {"name": experiment}}
    _, rows = run_hybrid(cfg, experiment)
    by = {(r["model"], r["mode"] or r["method"]): r for r in rows}
    must = ["baseline_ar", "replay_ar"] if experiment == "e2e_decode" else ["ar", "replayssm"]
    for model in ("tiny_kda", "kimi_linear_48b_a3b"):
        for m in must:
            r = by[(model, m)]
            assert r["status"] == "ok" and r["backend"] == "cpu" and r["ms_per_step"] > 0, r["message"]
            assert 0 < r["ssm_share"] < 1 and r["family"] == "kda"
    kimi = by[("kimi_linear_48b_a3b", must[1])]
    assert kimi["composed"] and kimi["bytes_kv"] > 0 and kimi["bytes_ssm"] > 0
    assert all(r["status"] == "ok" for r in rows), [(r["model"], r["mode"], r["message"]) for r in rows]


def test_the_concurrency_table_has_kimi_linear():
    b300 = yaml.safe_load((CONF_DIR / "hardware" / "b300.yaml").read_text())
    options = {"B": "16", "T": "4", "max_model_len": "2048", "gpu_memory_utilization": "0.9",
               "max_num_batched_tokens": "8192", "activation_reserve_gb": "", "tp": "", "weights": "checkpoint"}
    native, replay = fpm.concurrency_table(["kimi_linear_48b_a3b"], b300, options)
    spec = hybrid_spec(load_model_config("kimi_linear_48b_a3b"))
    fp = fpm.footprint(spec, "native", act_dtype=torch.bfloat16, state_dtype=torch.float32, max_model_len=2048,
                       spec_T=4)
    assert fp.kv_per_seq == (7 + 1) * 2048 * 576 * 2               # 7 MLA layers + the MTP layer's, bf16 latent
    assert 95 < native["weights_GB"] < 105                          # 48B + the MTP layer, BF16
    assert replay["ratio_vllm"] > 1.5 and native["vllm"] > 0
