"""kernel_tree plumbing on a tiny grid: rows per shape and method, the ratios, failing input refused before
any run directory exists, and experiments/report/figures/tree.py on the result. Timings are not checked (CPU noise)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from experiments.kernel_tree import acceptance_schedule, run_tree, tree_shape


def _cfg(tmp_path, **sweep):
    base = dict(name="t", models=["tiny_mamba2", "tiny_gdn"], shapes=["chain4", "binary2", "2x2"],
                methods=["replay_tree", "replay_chain", "native_tree", "commit_replay_tree", "stree"],
                batch=[2], history_len=[8], acceptance=[0.7], steps=2, threads=1)
    base.update(sweep)
    return {"sweep": base, "timing": {"cpu_warmup": 0, "cpu_repeats": 1, "cpu_min_sample_us": 0, "cpu_clock": "auto"},
            "out_dir": str(tmp_path), "run_id": "tree-test", "seed": 3}


def test_tree_shapes():
    assert tree_shape("chain4") == [-1, 0, 1, 2]
    assert tree_shape("binary2") == [-1, 0, 0, 1, 1, 2, 2]
    assert tree_shape("2x2") == [-1, 0, 1, 0, 3]
    assert len(tree_shape("full2ary15")) == 15
    with pytest.raises(ValueError, match="unknown shape"):
        tree_shape("bush")


def test_acceptance_follows_first_accepted_child():
    gen = torch.Generator().manual_seed(0)
    par = tree_shape("4x2")
    for p, expect in ((1.0, 3), (0.0, 1)):
        for path, acc in acceptance_schedule(par, p, 3, 2, gen):
            assert acc.tolist() == [expect] * 3
            assert path[:, :expect].tolist()[0][: 2] == [0, 1][:expect]       # p = 1: the first child, then on


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_run_tree_rows_and_plots(tmp_path, backend):
    run_dir = run_tree(_cfg(tmp_path, backend=backend))
    df = pd.read_csv(run_dir / "tree_rows.csv")
    assert (df.status == "ok").all(), df[df.status != "ok"].error.tolist()
    # the ring methods run on sweep.backend, the baselines (no CPU kernels) on torch
    ring = df.method.isin(["replay_tree", "replay_chain", "stree"])
    assert (df[ring].backend == backend).all() and (df[~ring].backend == "torch").all()
    # replay_chain runs on the chain shape only: 2 models x (3 shapes x 4 methods + 1)
    assert len(df) == 2 * (3 * 4 + 1)
    ring_chain = df[(df.method == "replay_tree") & (df["shape"] == "chain4")]
    assert (ring_chain.speedup_vs_chain == 1.0).all()
    nat = df[df.method == "native_tree"]
    assert (nat.speedup_vs_native == 1.0).all() and (nat.byte_ratio_native_over_method == 1.0).all()
    ring_vs_native = df[df.method == "replay_tree"].speedup_vs_native
    assert ring_vs_native.isna().all() if backend == "cpu" else ring_vs_native.notna().all()   # never cross-backend
    assert (df[df.method == "replay_tree"].byte_ratio_native_over_method > 1.0).all()
    assert (df.accepted_per_step >= 1).all()
    from experiments.report.figures.tree import main

    assert main([str(run_dir)]) == 0
    text = (run_dir / "tree_table.md").read_text()
    assert text.count("| tiny_") == 6 and f"{backend}: " in text
    assert (run_dir / "tree_tokens_per_s.png").stat().st_size > 0


@pytest.mark.parametrize("sweep, msg", [
    ({"shapes": ["chain4", "tree?"]}, "unknown shape"),
    ({"methods": ["replay_tree", "magic"]}, "unknown method"),
    ({"acceptance": [1.5]}, "not in"),
    ({"shapes": ["full2ary15"]}, "history_len=8 < N=15"),
    ({"backend": "triton"}, "backend one of"),
])
def test_bad_sweep_refused_before_any_run(tmp_path, sweep, msg):
    with pytest.raises(ValueError, match=msg):
        run_tree(_cfg(tmp_path, **sweep))
    assert not (tmp_path / "tree").exists()
