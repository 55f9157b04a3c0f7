"""One SSM layer, tree speculation: verify an N-node draft tree + commit the accepted branch, per tree shape.

    python -m experiments.kernel_tree                    # sweep=tree_cpu: the CPU sweep (a minute or two)
    python -m experiments.kernel_tree sweep=tree_cpu 'sweep.batch=[8,32]' 'sweep.acceptance=[0.6,0.8]'
    python -m experiments.kernel_tree sweep.backend=torch  # the ring methods on the vectorised PyTorch form

Methods: replay_tree (replayssm.{mamba2,gdn,kda}.tree_verify / tree_commit on the ring), replay_chain (the
chain API spec_verify / spec_commit, on the chain shapes only: the control), native_tree (one state snapshot
per node, baselines/native_tree_spec.py), commit_replay_tree (a frozen state, the accepted branch replayed at
commit) and stree (STree's activation replay: the ring flushing every step), baselines/commit_replay_tree.py.
sweep.backend (torch or cpu) is what the ring methods (replay_tree, replay_chain, stree) run on: cpu = the
fused C/OpenMP kernels (replayssm/cpu), as the CPU sweeps of the other experiments. The two baselines have no
CPU kernels and always run on torch; every row says the backend it ran, and a ratio never pairs two backends
(as scripts/report/aggregate.py keys its pairings on backend): under backend=cpu the ring's ratio to the native tree
is left empty. sweep=tree_cpu therefore keeps torch, the like-for-like comparison with the baselines. Every
family's ring methods have C kernels (KDA: GDN's, per-channel mode); a baseline or byte model a family
lacks (baselines/<tree module>.<family>_tree_verify, replayssm.traffic.tree_traffic) gives a skipped row or an
empty bytes column, never an error.

Acceptance is per node: at each depth the children of the last accepted node are tried in order, each
accepted with probability p, and the branch follows the first accepted child (a step always commits node 0,
the current token). One schedule per point, drawn from `seed`, shared by every method. Rows: mean accepted
tokens per step, verify + commit time per step (CPU: median of samples, thread CPU time on one torch
thread), tokens/s = batch x accepted / step time, the ratio to the chain control and to the native tree on
the same point, and the byte model (replayssm.traffic.tree_traffic) with its ratio native / method. A failing
point becomes a row with status=error and the sweep goes on. Rows go to
<out_dir>/tree/cpu/<run_id>/tree_rows.csv with env.json and config.yaml (CPU only: no GPU path yet).
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import pandas as pd
import torch
from omegaconf import OmegaConf

from baselines import commit_replay_tree as crt
from baselines import native_tree_spec as nts
from experiments.harness import timing
from experiments.harness.env import collect_env, new_run_id
from experiments.harness.points import load_model_config, model_spec
from experiments.harness.store import failure
from replayssm import traffic
from replayssm.geometry import Mamba2Geometry

REPO = Path(__file__).resolve().parents[1]
METHODS = ("replay_tree", "replay_chain", "native_tree", "commit_replay_tree", "stree")
BACKENDS = ("cpu", "torch")
RING_METHODS = ("replay_tree", "replay_chain", "stree")   # on sweep.backend; the baselines run on torch
TRAFFIC = {"replay_tree": "replay_tree", "replay_chain": "replay_tree", "native_tree": "native_tree",
           "commit_replay_tree": "commit_replay_tree", "stree": "stree"}   # replayssm.traffic.tree_traffic


def tree_shape(name: str) -> list[int]:
    """parents of a named shape: chainT (T nodes), binaryD (full binary tree of depth D draft levels, 2^(D+1)-1
    nodes), full2ary15 (= binary3), KxD (EAGLE-style: K chains of D drafts under node 0, 1 + K D nodes)."""
    if name.startswith("chain"):
        T = int(name[5:])
        return [-1] + list(range(T - 1))
    if name.startswith("binary") or name == "full2ary15":
        d = 3 if name == "full2ary15" else int(name[6:])
        n = 2 ** (d + 1) - 1
        return [-1] + [(s - 1) // 2 for s in range(1, n)]
    if "x" in name:
        k, d = (int(v) for v in name.split("x"))
        par = [-1]
        for _ in range(k):
            prev = 0
            for _ in range(d):
                par.append(prev)
                prev = len(par) - 1
        return par
    raise ValueError(f"sweep.shapes: unknown shape {name!r}; use chainT, binaryD, full2ary15 or KxD (e.g. 2x4)")


def _depth(par: list[int]) -> int:
    d = [0] * len(par)
    for s in range(1, len(par)):
        d[s] = d[par[s]] + 1
    return max(d) + 1


def acceptance_schedule(par: list[int], p: float, batch: int, steps: int, gen: torch.Generator):
    """Per step: (path int32 [batch, depth] padded with -1, num_accepted int32 [batch])."""
    depth = _depth(par)
    kids = [[c for c in range(len(par)) if par[c] == s] for s in range(len(par))]
    out = []
    for _ in range(steps):
        path = torch.full((batch, depth), -1, dtype=torch.int32)
        acc = torch.empty(batch, dtype=torch.int32)
        for b in range(batch):
            br = [0]
            while True:
                nxt = next((c for c in kids[br[-1]] if float(torch.rand((), generator=gen)) < p), None)
                if nxt is None:
                    break
                br.append(nxt)
            path[b, : len(br)] = torch.tensor(br, dtype=torch.int32)
            acc[b] = len(br)
        out.append((path, acc))
    return out


def _windows(spec, batch: int, N: int, steps: int, gen: torch.Generator) -> list[dict]:
    # the family packages are imported where a family's point runs: each loads its Triton kernels
    if spec.family == "mamba2":
        from replayssm.mamba2.inputs import random_step
        return [random_step(spec.geometry, batch, window=N, with_z=spec.has_z, generator=gen) for _ in range(steps)]
    if spec.family == "gdn":
        from replayssm.gdn.inputs import random_step
    else:
        from replayssm.kda.inputs import random_step
    return [random_step(spec.geometry, batch, window=N, use_qk_l2norm=spec.use_qk_l2norm, generator=gen)
            for _ in range(steps)]


def method_backend(method: str, backend: str) -> str:
    """The backend a method runs on: sweep.backend for the ring methods (every family has the C tree verify),
    torch for the baselines."""
    return backend if method in RING_METHODS else "torch"


class Unavailable(Exception):
    """A baseline this family has no implementation of: the row is `skipped` with the reason."""


def _baseline_verify(module, family: str):
    fn = getattr(module, f"{family}_tree_verify", None)
    if fn is None:
        raise Unavailable(f"{module.__name__} has no {family}_tree_verify")
    return fn


def _cycle(spec, method: str, par: list[int], batch: int, history_len: int, windows, schedule, gen,
           backend: str = "torch"):
    """A zero-argument cycle running every step of the schedule (verify + commit) on fresh caches; the ring
    methods on `backend`."""
    N = len(par)
    parents = torch.tensor(par, dtype=torch.int32)
    geo = spec.geometry
    mamba = isinstance(geo, Mamba2Geometry)
    if mamba:
        from replayssm import mamba2 as fam
        from replayssm.mamba2.inputs import random_params, random_state
        prm = random_params(geo, generator=gen)
        extra = dict(A=prm.A, D=prm.D, dt_bias=prm.dt_bias, dt_softplus=spec.dt_softplus)
    elif spec.family == "gdn":
        from replayssm import gdn as fam
        from replayssm.gdn.inputs import random_state
        extra = dict(use_qk_l2norm=spec.use_qk_l2norm)
    else:
        from replayssm import kda as fam
        from replayssm.kda.inputs import random_state
        extra = dict(use_qk_l2norm=spec.use_qk_l2norm)
    state0 = random_state(geo, batch, generator=gen)

    def args(w):
        if mamba:
            return dict(x=w["x"], dt=w["dt"], B=w["B"], C=w["C"], z=w["z"], **extra)
        return dict(**w, **extra)

    if method == "native_tree":
        snap = nts.TreeSnapshots.allocate(geo, batch, N)
        snap.snapshots[:, 0] = state0
        verify = _baseline_verify(nts, spec.family)

        def cycle():
            for w, (path, acc) in zip(windows, schedule):
                verify(snap, **args(w), parents=parents, backend="torch")
                nts.tree_commit(snap, path, acc, backend="torch")
        return cycle
    if method == "commit_replay_tree":
        cache = crt.TreeReplayCache.allocate(geo, batch, N)
        cache.state.copy_(state0)
        verify = _baseline_verify(crt, spec.family)

        def cycle():
            for w, (path, acc) in zip(windows, schedule):
                verify(cache, **args(w), parents=parents, backend="torch")
                crt.tree_commit(cache, path, acc, backend="torch")
        return cycle
    # STree: a ring that flushes every step (baselines/commit_replay_tree.py); its history never exceeds N
    ring = fam.SpecRing.allocate(geo, batch, N if method == "stree" else history_len, N)
    ring.state.copy_(state0)
    if method == "stree":
        def cycle():
            for w, (path, acc) in zip(windows, schedule):
                fam.tree_verify(ring, **args(w), parents=parents, backend=backend)
                crt.stree_commit(fam, ring, path, acc, backend=backend)
        return cycle
    if method == "replay_chain":
        def cycle():
            for w, (_, acc) in zip(windows, schedule):
                fam.spec_verify(ring, **args(w), backend=backend)
                fam.spec_commit(ring, acc, backend=backend)
        return cycle

    def cycle():
        for w, (path, acc) in zip(windows, schedule):
            fam.tree_verify(ring, **args(w), parents=parents, backend=backend)
            fam.tree_commit(ring, path, acc, backend=backend)
    return cycle


def run_tree(cfg) -> Path:
    data = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    data.pop("hydra", None)
    sw, tm = data["sweep"], data["timing"]
    for m in sw["methods"]:
        if m not in METHODS:
            raise ValueError(f"sweep.methods: unknown method {m!r}; expected some of {METHODS}")
    for p in sw["acceptance"]:
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"sweep.acceptance: per-node acceptance {p} is not in [0, 1]")
    backend = sw.get("backend", "torch")
    if backend not in BACKENDS:
        raise ValueError(f"sweep.backend={backend!r}: the tree sweep runs on CPU, backend one of {BACKENDS}")
    shapes = {name: tree_shape(name) for name in sw["shapes"]}         # ValueError before any work
    specs = []
    for key in sw["models"]:
        name, _, tp = key.partition("@tp")
        specs.append(model_spec(load_model_config(name), int(tp) if tp else None))
    for hl in sw["history_len"]:
        for name, par in shapes.items():
            if hl < len(par):
                raise ValueError(f"sweep.history_len={hl} < N={len(par)} nodes of shape {name}: the ring needs B >= N")
    torch.set_num_threads(int(sw.get("threads", 1)))
    root = Path(data.get("out_dir") or REPO / "results")
    run_dir = root / "tree" / "cpu" / (data.get("run_id") or new_run_id())
    run_dir.mkdir(parents=True, exist_ok=False)                           # a run never overwrites another
    env = collect_env(device="cpu", hardware={"name": "cpu"}, timing=tm, sweep=sw)
    (run_dir / "env.json").write_text(json.dumps(env, indent=1, default=str))
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(data)))
    clock = timing.cpu_clock(tm.get("cpu_clock", "auto"))
    rows = []
    for spec in specs:
        for name, par in shapes.items():
            N, depth = len(par), _depth(par)
            is_chain = depth == N
            for batch in sw["batch"]:
                for hl in sw["history_len"]:
                    for p in sw["acceptance"]:
                        gen = torch.Generator().manual_seed(int(data.get("seed", 0)))
                        schedule = acceptance_schedule(par, float(p), batch, int(sw["steps"]), gen)
                        windows = _windows(spec, batch, N, int(sw["steps"]), gen)
                        acc_mean = float(torch.stack([a for _, a in schedule]).float().mean())
                        for method in sw["methods"]:
                            if method == "replay_chain" and not is_chain:
                                continue
                            row = dict(model=spec.key, family=spec.family, shape=name, N=N, depth=depth, batch=batch,
                                       history_len=hl, p_node=p, method=method,
                                       backend=method_backend(method, backend),
                                       accepted_per_step=acc_mean,
                                       status="ok", error=None)
                            try:
                                cycle = _cycle(spec, method, par, batch, hl, windows, schedule,
                                               torch.Generator().manual_seed(int(data.get("seed", 0)) + 1),
                                               row["backend"])
                                t = timing.time_cpu(cycle, len(schedule), warmup=int(tm["cpu_warmup"]),
                                                    repeats=int(tm["cpu_repeats"]),
                                                    min_sample_us=float(tm["cpu_min_sample_us"]), clock=clock)
                                a_int = min(depth, max(1, round(acc_mean)))
                                try:
                                    model_bytes = traffic.tree_traffic(spec.geometry, TRAFFIC[method], N, depth,
                                                                       a_int, hl, act_bytes=4).total
                                except ValueError:                     # a family without a tree byte model
                                    model_bytes = None
                                row.update(step_us=t.median_us, step_us_p20=t.p20_us, step_us_p80=t.p80_us,
                                           tokens_per_s=batch * acc_mean / t.median_us * 1e6,
                                           model_bytes_per_step=model_bytes)
                            except Unavailable as exc:
                                row["status"], row["error"] = "skipped", str(exc)
                            except Exception as exc:                   # recorded; the sweep goes on
                                row["status"], row["error"] = failure(exc)
                            rows.append(row)
                            print(f"  {spec.key} {name} b={batch} hist={hl} p={p} {method}: "
                                  + (f"{row['step_us']:.0f} us/step" if row["status"] == "ok" else row["error"]),
                                  flush=True)
    df = pd.DataFrame(rows)
    df = add_ratios(df)
    df.to_csv(run_dir / "tree_rows.csv", index=False)
    print(f"kernel_tree: {len(df)} rows -> {run_dir / 'tree_rows.csv'}")
    return run_dir


def add_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """tokens/s over the chain control (replay_tree on the chain shape of the same model, batch, history, p,
    hence the same backend) and over native_tree on the same point when both ran on the same backend (else
    empty: a cpu kernel over a torch baseline is no speedup); the byte-model ratio native / method."""
    if "tokens_per_s" not in df:
        return df
    point = ["model", "batch", "history_len", "p_node"]
    chain = df[(df.method == "replay_tree") & (df.depth == df.N) & (df.status == "ok")]
    chain = chain.sort_values("N").groupby(point, as_index=False).first()[point + ["tokens_per_s"]]
    df = df.merge(chain.rename(columns={"tokens_per_s": "chain_tokens_per_s"}), on=point, how="left")
    nat = df[(df.method == "native_tree") & (df.status == "ok")][point + ["shape", "backend", "tokens_per_s",
                                                                          "model_bytes_per_step"]]
    nat = nat.rename(columns={"tokens_per_s": "native_tokens_per_s", "model_bytes_per_step": "native_model_bytes",
                              "backend": "native_backend"})
    df = df.merge(nat, on=point + ["shape"], how="left")
    df["speedup_vs_chain"] = df.tokens_per_s / df.chain_tokens_per_s
    same = df.backend == df.native_backend
    df["speedup_vs_native"] = (df.tokens_per_s / df.native_tokens_per_s).where(same)
    df["byte_ratio_native_over_method"] = df.native_model_bytes / df.model_bytes_per_step
    return df


@hydra.main(version_base="1.3", config_path="../conf", config_name="kernel_tree")
def main(cfg) -> str:
    return str(run_tree(cfg))


if __name__ == "__main__":
    main()
