"""Paired CPU timing of the Kimi Delta Attention spec C kernels against GDN's (CPU numbers only).

At Kimi-Linear's TP8 head shape (H = HV = 4, K = V = 128, conf/model/kimi_linear_48b_a3b.yaml at tp 8), fp32,
window T = 4, history 16, torch threads 1 (the kernels' OpenMP threads follow it): per method and batch, one
step of KDA and one of GDN alternate per round (order flipped every round) and each step uses the next group of
`batch` slots of a pool of about 300 MiB per family, so the state streams from DRAM rather than L3. Steps are
the C calls only (replayssm/cpu/ops.py): ring = gdn_spec_replay (its cursor commit, torch, outside the timing),
native = gdn_spec_native, cr = gdn_cr_verify + gdn_cr_commit; accepted counts 1 + (row + round) mod T.
Prints the medians, the median of the per-round KDA / GDN ratios (`paired`) and the minima.

    PYTHONPATH=$PWD .venv/bin/python scripts/kernels/cpu_kda_spec_pairs.py --batch 8,16,32 --rounds 80
"""

from __future__ import annotations

import argparse
import time

import torch

from baselines import gdn_commit_replay, gdn_recurrent_spec, kda_commit_replay, kda_recurrent_spec
from replayssm import gdn, kda
from replayssm.cpu import ops
from replayssm.gdn.inputs import random_step as gdn_step
from replayssm.geometry import GDNGeometry, KDAGeometry
from replayssm.kda.inputs import random_step as kda_step

T, HISTORY, POOL_BYTES = 4, 16, 300 << 20
FAMILIES = {"gdn": (GDNGeometry(H=4, HV=4, K=128, V=128), gdn, gdn_recurrent_spec, gdn_commit_replay, gdn_step),
            "kda": (KDAGeometry(H=4, HV=4, K=128, V=128), kda, kda_recurrent_spec, kda_commit_replay, kda_step)}


def _cache(family: str, method: str, num_slots: int):
    gm, mod, native, cr, _ = FAMILIES[family]
    if method == "ring":
        c = mod.SpecRing.allocate(gm, num_slots, HISTORY, T)
    elif method == "native":
        c = native.SpecStates.allocate(gm, num_slots, T)
    else:
        c = cr.CommitReplayCache.allocate(gm, num_slots, T)
    for name in ("u", "k", "v", "g", "beta"):        # first touch (page faults) outside the timing
        if isinstance(getattr(c, name, None), torch.Tensor):
            getattr(c, name).fill_(0.0)
    c.state.normal_().mul_(0.05)
    return c


def _step(method: str, c, x, out, slots, acc) -> float:
    args = (c, x["q"], x["k"], x["v"], x["g"], x["beta"], 128 ** -0.5, True, out, slots)
    t0 = time.perf_counter()
    if method == "ring":
        ops.gdn_spec_replay(*args)
    elif method == "native":
        ops.gdn_spec_native(*args)
    else:
        ops.gdn_cr_verify(*args)
        ops.gdn_cr_commit(c, acc, slots)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="8,16,32")
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--methods", default="ring,native,cr")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gm = FAMILIES["gdn"][0]
    for batch in (int(b) for b in args.batch.split(",")):
        for method in args.methods.split(","):
            per_slot = gm.HV * gm.V * gm.K * 4 * (T if method == "native" else 1)
            groups = max(2, POOL_BYTES // (per_slot * batch))
            caches = {f: _cache(f, method, groups * batch) for f in FAMILIES}
            xs = {f: FAMILIES[f][4](FAMILIES[f][0], batch, window=T, use_qk_l2norm=True) for f in FAMILIES}
            out = torch.empty(batch, T, gm.HV, gm.V)
            times: dict[str, list[float]] = {f: [] for f in FAMILIES}
            for r in range(args.rounds + 3):                 # 3 warm-up rounds
                slots = torch.arange((r % groups) * batch, (r % groups + 1) * batch, dtype=torch.int32)
                acc = (1 + (torch.arange(batch) + r) % T).to(torch.int32)
                for f in ("gdn", "kda") if r % 2 else ("kda", "gdn"):
                    dt = _step(method, caches[f], xs[f], out, slots, acc)
                    if method == "ring":
                        FAMILIES[f][1].spec_commit(caches[f], acc, slots=slots, backend="torch")
                    if r >= 3:
                        times[f].append(dt)
            g, k = torch.tensor(times["gdn"]), torch.tensor(times["kda"])
            print(f"batch {batch:3d} {method:6s}: GDN {g.median() * 1e3:7.3f} ms  KDA {k.median() * 1e3:7.3f} ms  "
                  f"KDA/GDN medians {k.median() / g.median():.3f}  paired {(k / g).median():.3f}  "
                  f"min GDN {g.min() * 1e3:.3f} KDA {k.min() * 1e3:.3f} ms ({args.rounds} rounds)", flush=True)
            del caches


if __name__ == "__main__":
    main()
