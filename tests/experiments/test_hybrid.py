"""The hybrid model end to end (experiments/hybrid): ReplaySSM in the whole decode step gives the baseline's
logits, a real greedy draft/verify/commit loop emits the AR tokens in every speculative mode, the analytic
footprint matches the bytes allocated, and bad configs are refused before any work. Tiny models, CPU."""

import dataclasses

import pytest
import torch
from harness_doubles import scheduled_drafts

from experiments.harness.methods import REGISTRY
from experiments.harness.points import load_model_config
from experiments.hybrid.footprint import footprint, max_concurrency
from experiments.hybrid.generate import accept_greedy, greedy_ar, greedy_speculative
from experiments.hybrid.layers import SSMCall
from experiments.hybrid.model import HybridModel, MTPDrafter
from experiments.hybrid.spec import SSM_KINDS, hybrid_spec, parse_pattern
from replayssm.testing import rel_err, tolerance

TINY = ["tiny_mamba2", "tiny_gdn"]
WITH_KDA = TINY + ["tiny_kda"]         # tiny_kda: KDA mixers and an MLA attention layer (Kimi-Linear-like)
F32 = torch.float32


def _landed(method, name):
    """Skip a KDA point whose method module has not landed yet (replayssm.kda / baselines.kda_* grow in steps)."""
    reason = REGISTRY[method].unavailable(_spec(name).family, "cpu", "torch")
    if reason is not None:
        pytest.skip(reason)


def _spec(name, **changes):
    spec = hybrid_spec(load_model_config(name))
    return dataclasses.replace(spec, **changes) if changes else spec


def _model(spec, method, gen_seed, batch, capacity, T=None, context=40):
    route = ("output_only" if spec.family == "mamba2" else "state_and_output") if method == "replay_ar" else None
    call = SSMCall(spec.family, "torch", spec.geometry, F32, F32, route=route, buffer_len=spec.buffer_len,
                   spec_T=T, history_len=spec.history_len)
    model = HybridModel(spec, ssm_method=method, call=call, num_slots=batch, capacity=capacity,
                        gen=torch.Generator().manual_seed(gen_seed), device="cpu")
    model.reset(context, torch.Generator().manual_seed(gen_seed + 1))
    return model


@pytest.mark.parametrize("name", WITH_KDA)
def test_e2e_logits_with_replayssm_equal_the_baseline_over_64_steps(name, gen):
    _landed("baseline_ar", name)
    spec = _spec(name)                                         # buffer_len 4: 16 flushes in 64 steps
    seed = int(torch.randint(0, 2**30, (1,), generator=gen))
    base, replay = (_model(spec, m, seed, batch=3, capacity=120) for m in ("baseline_ar", "replay_ar"))
    tok = torch.randint(0, spec.vocab, (3,), generator=gen)
    worst = 0.0
    for _ in range(64):
        want, _ = base.decode(tok)
        got, _ = replay.decode(tok)
        worst = max(worst, rel_err(got, want))
        tok = want.argmax(-1)                                  # both fed the baseline's tokens
    assert worst <= tolerance(F32), f"{name}: worst logits rel_err {worst:.2e} over 64 steps"
    assert worst > 0.0 or spec.family == "gdn"                 # a different code path, not the same call twice
    assert replay.lengths.tolist() == [40 + 64] * 3


@pytest.mark.parametrize("name", WITH_KDA)
@pytest.mark.parametrize("method", ["baseline_spec", "commit_replay_spec", "replay_spec"])
def test_greedy_speculative_loop_emits_exactly_the_ar_tokens(name, method, gen):
    _landed(method, name)
    _landed("baseline_ar", name)
    spec, T, n, batch = _spec(name), 3, 24, 3
    seed = int(torch.randint(0, 2**30, (1,), generator=gen))
    tok0 = torch.randint(0, spec.vocab, (batch,), generator=gen)
    ar = greedy_ar(_model(spec, "baseline_ar", seed, batch, capacity=40 + 2 * n * T + 8), tok0, n + T)
    model = _model(spec, method, seed, batch, capacity=40 + 2 * n * T + 8, T=T)
    mtp = MTPDrafter(model, torch.Generator().manual_seed(seed + 7), model.capacity)
    mtp.reset(40, torch.Generator().manual_seed(seed + 8))
    calls, done = [0], torch.zeros(batch, dtype=torch.long)

    def drafter(token, hidden, k):
        """Every other window the MTP module drafts; otherwise the AR continuation made wrong from a scheduled
        position on (scheduled_drafts): with batch 3 = T, each such window's rows accept 1, 2 and T tokens
        (all-reject, partial, all-accept: desynchronised rows) by construction."""
        calls[0] += 1
        if calls[0] % 2:
            return mtp.draft(token, hidden, k)
        return scheduled_drafts(ar, done, k, calls[0] // 2, spec.vocab, gen)

    def on_commit(accepted):
        done.add_(accepted.long())
        mtp.sync_lengths()

    hidden = torch.randn(batch, spec.hidden, generator=gen)
    out, history = greedy_speculative(model, drafter, tok0, hidden, n, T, on_commit=on_commit)
    assert torch.equal(out, ar[:, :n]), f"{name} {method}: speculative tokens differ from AR"
    counts = torch.cat(history)
    assert counts.min() >= 1 and counts.max() <= T
    assert set(counts.tolist()) == set(range(1, T + 1))       # all-reject, partial and all-accept windows ran


def test_accept_greedy_counts_leading_matches():
    target = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    drafts = torch.tensor([[1, 6, 7], [5, 6, 7], [5, 0, 7]])
    assert accept_greedy(drafts, target).tolist() == [1, 4, 2]


@pytest.mark.parametrize("name", WITH_KDA)
@pytest.mark.parametrize("mode, method", [("ar", "baseline_ar"), ("native", "baseline_spec"),
                                          ("replayssm", "replay_spec"), ("commit_replay", "commit_replay_spec")])
def test_footprint_matches_the_bytes_allocated(name, mode, method):
    _landed(method, name)
    _landed("baseline_ar", name)                               # the MTP drafter runs baseline_ar
    spec, T, batch, max_len = _spec(name), 4, 5, 300
    model = _model(spec, method, 1, batch, capacity=max_len, T=T if mode != "ar" else None)
    allocated = model.weight_bytes() + model.embed_head_bytes() + sum(model.cache_bytes().values())
    if mode != "ar":
        mtp = MTPDrafter(model, torch.Generator().manual_seed(3), max_len)
        allocated += mtp.weight_bytes() + mtp.mtp.cache_bytes()["kv"]
    fp = footprint(spec, mode, act_dtype=F32, state_dtype=F32, max_model_len=max_len, spec_T=T)
    analytic = fp.weights + batch * fp.per_seq
    assert abs(analytic - allocated) <= 0.05 * allocated, f"{name} {mode}: {analytic} vs {allocated} bytes"
    assert max_concurrency(fp.weights + 7 * fp.per_seq + 1, fp) == 7


def _cfg(tmp_path, experiment, **sweep):
    base = dict(models=["tiny_mamba2"], batch=[2], context_len=[16], methods=["baseline_ar", "replay_ar"],
                modes=["ar", "replayssm"], spec_T=[3], acceptance=[{"kind": "rate", "p": 0.7}], spec_steps=4,
                route="output_only", state_dtype="float32", act_dtype="float32", backend="torch", build="full",
                max_model_len=256, hbm_fallback_bytes=10**10, hbm_util=0.9, cpu_repeats=1, cpu_warmup=0, threads=1)
    base.update(sweep)
    return {"sweep": base, "device": "cpu", "seed": 0, "out_dir": str(tmp_path), "progress": False,
            "timing": {"cpu_clock": "auto", "warmup_ms": 1, "rep_ms": 1}, "hardware": {"name": "cpu"},
            "experiment": {"name": experiment}}


@pytest.mark.parametrize("experiment, sweep, match", [
    ("serving", {"spec_T": [9]}, r"spec_T=9 > history_len"),
    ("serving", {"spec_T": [5], "acceptance": ["workload:mtp_gsm8k_qwen3next"]},
     r"sweep.acceptance\[0\]: workload 'mtp_gsm8k_qwen3next' publishes 3 draft positions"),
    ("e2e_decode", {"context_len": [253]}, r"KV budget sweep.max_model_len=256"),
    ("serving", {"context_len": [240]}, r"KV budget"),
    ("serving", {"hbm_bytes": "room for 2.5 sequences", "batch": [4]}, r"batch 4 cannot fit the HBM budget"),
    ("e2e_decode", {"methods": ["baseline_ar", "warp"]}, r"sweep.methods\[1\]"),
    ("serving", {"modes": ["eagle"]}, r"sweep.modes\[0\]"),
    ("e2e_decode", {"act_dtype": "bfloat16"}, r"bfloat16 is not timed on CPU"),
])
def test_bad_configs_are_refused_before_any_work(tmp_path, experiment, sweep, match):
    from experiments.hybrid.run import run_hybrid

    if sweep.get("hbm_bytes"):                                 # weights + 2.5 sequences of the replayssm mode
        fp = footprint(_spec("tiny_mamba2"), "replayssm", act_dtype=F32, state_dtype=F32, max_model_len=256, spec_T=3)
        sweep["hbm_bytes"] = int((fp.weights + 2.5 * fp.per_seq) / 0.9)
    with pytest.raises(ValueError, match=match):
        run_hybrid(_cfg(tmp_path, experiment, **sweep), experiment)
    assert not any(tmp_path.iterdir())                         # nothing written


def test_unknown_layer_kind_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown layer kind 'X' at position 2"):
        parse_pattern("M-X*")
    cfg = load_model_config("tiny_gdn")
    cfg["layers"]["pattern"] = "G-M-"
    with pytest.raises(ValueError, match="does not match family"):
        hybrid_spec(cfg)


def test_runners_write_rows_on_cpu(tmp_path):
    from experiments.hybrid.run import run_hybrid

    run_dir, rows = run_hybrid(_cfg(tmp_path, "e2e_decode"), "e2e_decode")
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["message"] for r in rows]
    assert all(r["weights"] == "random" and 0 < r["ssm_share"] < 1 and r["ms_per_step"] > 0 for r in rows)
    assert rows[1]["rel_err"] <= 20 * tolerance(F32) and "gate ok" in rows[1]["message"]
    cfg = _cfg(tmp_path, "serving", models=["tiny_gdn"])
    cfg["resume"] = str(run_dir)
    run_dir2, rows = run_hybrid(cfg, "serving")
    assert run_dir2 == run_dir and (run_dir / "e2e_rows.csv").exists() and (run_dir / "serving_rows.csv").exists()
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["message"] for r in rows]
    spec_row = next(r for r in rows if r["mode"] == "replayssm")
    assert 1 <= spec_row["mean_accepted"] <= 3 and spec_row["draft_us"] > 0 and spec_row["max_concurrency"] > 2
    _, again = run_hybrid(cfg, "serving")                      # resume: every point already recorded
    assert again == []



@pytest.mark.parametrize("name", WITH_KDA)
def test_replay_layers_share_one_cursor_per_row(name):
    """Every SSM layer of a ReplaySSM model holds the model's one cursor per row (moved once per step)."""
    from replayssm.ring_cursors import DecodeCursor, SpecCursor

    for method, kind, T in (("replay_ar", DecodeCursor, None), ("replay_spec", SpecCursor, 2),
                            ("baseline_ar", None, None)):
        model = _model(_spec(name), method, 0, batch=2, capacity=64, T=T)
        caches = [layer.cache for ch, _, layer in model.layers if ch in SSM_KINDS]
        if kind is None:
            assert model.ssm_cursor is None
            continue
        assert isinstance(model.ssm_cursor, kind) and len(caches) > 1
        assert all(c.write_pos is model.ssm_cursor.write_pos and c.shared_cursor for c in caches)
