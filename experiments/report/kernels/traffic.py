"""Every kernel's counted HBM bytes beside the byte model (replayssm/traffic.py), on a CPU.

Each method runs through its public API with the Triton backend under the interpreter, one sequence (one
slot, batch 1), fp32 state and fp16 activations (the model's 4- and 2-byte sizes; the interpreter cannot
run bf16). replayssm/testing_traffic.py counts the bytes every launch loads and stores, masked-off elements
excluded; a step's count is the sum over its launches (verify + commit, step + cursor) of each tensor's
*unique* bytes, the model's accounting ("every byte a kernel must move at least once").

Rows, per method and geometry:
    AR replay        every fill h = 0..L-1 of one flush cycle, and the cycle's mean step
    AR baselines     one step
    native spec      one step (verify + commit)
    commit replay    one step per accepted count a = 1..T
    ReplaySSM spec   every (h, flush) step from a reset into the steady cycle at a fixed acceptance, and
                     the cycle's mean step (traffic.*_replay_spec)
Columns: counted and modelled read / write bytes and their relative difference. What the model leaves out
on purpose (EXCLUDED: slots, cursors, per-head parameters, ...) is not counted, and the reason is printed.

A second check ties the count to the model's "at least once": the state's issued loads must equal its
unique loads in every launch (a kernel that re-reads the state within a launch moves more than the model
says); the `state_rereads` column shows issued / unique state bytes.

KDA (replayssm.kda, baselines/kda_*) runs the GDN methods against replayssm/traffic_kda.py's model; after the
table, KDA's counted bytes are printed beside GDN's at the same head shape (HV, K, V): kda_small beside gdn_small,
Kimi-Linear beside the first GDN model of its 32 x 128 x 128 heads in the run (kda_beside_gdn).

Exit 1 when a read or write differs from the model by more than --tolerance (3 %) or the state is re-read.

Usage: TRITON_INTERPRET=1 python scripts/kernels/kernel_traffic.py [--geometry small|NAME]... [--method NAME]...
                                                                   [--arch 0|90|100] [--csv PATH]
The interpreter must be on before triton is imported: the command line sets TRITON_INTERPRET=1 when unset;
an importer of this module sets it itself (the suite runs with it on).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from replayssm import traffic as tr
from replayssm.gdn import inputs as gdn_inputs
from replayssm.geometry import (
    GDN_MODELS,
    KDA_MODELS,
    MAMBA2_MODELS,
    GDNGeometry,
    KDAGeometry,
    Mamba2Geometry,
    get_geometry,
)
from replayssm.kda import inputs as kda_inputs
from replayssm.mamba2 import inputs as m2_inputs
from replayssm.testing_traffic import TrafficCounter

STATE, ACT = torch.float32, torch.float16
TOLERANCE = 0.03
AR_BUFFER, SPEC_HISTORY, SPEC_WINDOW, SPEC_ACCEPTED = 4, 4, 2, 1
# kda_small has gdn_small's head shape, so the two families' rows compare byte for byte (KDA adds the
# per-channel g: K - 1 more fp32 per value head in every cached entry, input and stash).
SMALL = {"mamba2_small": Mamba2Geometry(nheads=4, headdim=16, dstate=32, ngroups=2),
         "gdn_small": GDNGeometry(H=2, HV=4, K=32, V=32),
         "kda_small": KDAGeometry(H=2, HV=4, K=32, V=32)}
ALL_MODELS = {**MAMBA2_MODELS, **GDN_MODELS, **KDA_MODELS}

# Tensor arguments the model leaves out, by kernel parameter name, and why (replayssm/traffic.py docstring).
EXCLUDED: dict[str, str] = {
    "slots_ptr": "slot ids (4 bytes per row): not state, input or cache",
    "wpos_ptr": "cursor (int32 per slot)",
    "write_pos_ptr": "cursor (int32 per slot)",
    "origin_ptr": "cursor (int32 per slot)",
    "is_flush_ptr": "cursor (int32 per slot)",
    "last_ptr": "native spec's snapshot index (int32 per slot)",
    "num_accepted_ptr": "accepted count (int32 per row)",
    "values_ptr": "accepted count or snapshot index (int32 per row, native Mamba-2 spec's cursor kernel)",
    "cursor_ptr": "native Mamba-2 spec's snapshot index (int32 per slot)",
    "A_ptr": "per-head parameter A [nheads] (ignored by the model, as in the method's roofline)",
    "D_ptr": "per-head parameter D [nheads] (ignored by the model)",
    "dt_bias_ptr": "per-head parameter dt_bias [nheads] (ignored by the model)",
    "bc_ptr": "Mamba-2 scratch bc_pre (B_j . C dots, ngroups fp32 per cached row; ignored by the model)",
}


@dataclass
class Row:
    method: str
    geometry: str
    step: str
    read: float
    write: float
    model_read: float
    model_write: float
    state_rereads: float = 1.0
    reuse: float = 0.0
    note: str = ""

    def diffs(self) -> tuple[float, float]:
        rel = lambda a, b: abs(a - b) / b if b else float(a != 0)  # noqa: E731
        return rel(self.read, self.model_read), rel(self.write, self.model_write)

    def ok(self, tolerance: float) -> bool:
        return max(self.diffs()) <= tolerance and self.state_rereads <= 1.0


def _is_state(name: str) -> bool:
    return any(part.startswith("state") for part in name.split("|"))


def _excluded(name: str) -> bool:
    return all(part in EXCLUDED for part in name.split("|"))


def count_step(counter: TrafficCounter) -> tuple[int, int, int, float, set[str]]:
    """(read, write, reuse, state issued/unique loads, unattributed kernels) of a step's launches.

    read / write: each phase's unique bytes (testing_traffic.phase_traffic), summed over phases. reuse:
    bytes a later launch of the same phase loaded again (what L2 serves between back-to-back launches)."""
    read = write = reuse = 0
    for phase in counter.phases():
        for name, t in phase.items():
            if _excluded(name):
                continue
            read += t.load_unique
            write += t.store_unique
            reuse += t.load_issued - t.load_unique
    issued = unique = 0
    unknown = set()
    for launch in counter.launches:
        for name, t in launch.tensors.items():
            if name == "?":
                unknown.add(f"{launch.kernel}:?")
            if _is_state(name):
                issued += t.load_issued
                unique += t.load_unique
    return read, write, reuse, (issued / unique if unique else 1.0), unknown


# ---------------------------------------------------------------------------------------------------------
# drivers: each yields (step label, run one step, model Traffic of that step)

Step = tuple[str, Callable[[], None], tr.Traffic]
SLOT = torch.tensor([1], dtype=torch.int32)          # slot 1 of a 2-slot pool: slot 0 stays idle


def _mamba2_args(geom, window=None):
    p, x = m2_inputs.random_params(geom), m2_inputs.random_step(geom, 1, act_dtype=ACT, window=window, with_z=False)
    return dict(x=x["x"], dt=x["dt"], A=p.A, B=x["B"], C=x["C"], D=p.D, z=None, dt_bias=p.dt_bias,
                dt_softplus=True, slots=SLOT, backend="triton")


def _gdn_args(geom, window=None):
    return dict(gdn_inputs.random_step(geom, 1, act_dtype=ACT, window=window), slots=SLOT, backend="triton")


def _kda_args(geom, window=None):
    return dict(kda_inputs.random_step(geom, 1, act_dtype=ACT, window=window), slots=SLOT, backend="triton")


def family_of(geom) -> str:
    """"mamba2", "gdn" or "kda": which methods a geometry runs (KDAGeometry is not a GDNGeometry)."""
    return "mamba2" if isinstance(geom, Mamba2Geometry) else "kda" if isinstance(geom, KDAGeometry) else "gdn"


def _args(geom, window=None):
    return {"mamba2": _mamba2_args, "gdn": _gdn_args, "kda": _kda_args}[family_of(geom)](geom, window)


def _model(geom, name: str) -> Callable[..., tr.Traffic]:
    """The byte model's function `<family>_<name>` (replayssm/traffic.py; KDA's in replayssm/traffic_kda.py)."""
    return getattr(tr, f"{family_of(geom)}_{name}")


def replay_ar(route: str | None) -> Callable[[object], Iterator[Step]]:
    def steps(geom):
        family = family_of(geom)
        mod = importlib.import_module(f"replayssm.{family}")
        cache = mod.ReplayCache.allocate(geom, 2, AR_BUFFER, state_dtype=STATE, act_dtype=ACT)
        replay_step = mod.replay_step
        for h in range(AR_BUFFER):
            mamba = family == "mamba2"
            extra = {"route": route} if mamba else {}
            model = (tr.mamba2_replay_ar(geom, AR_BUFFER, h, route, 4, 2) if mamba
                     else _model(geom, "replay_ar")(geom, AR_BUFFER, h, 4, 2))
            yield _label(h, h == AR_BUFFER - 1), \
                lambda mark, extra=extra: replay_step(cache, **_args(geom), **extra), model
    return steps


def baseline_ar(geom):
    state_shape = ((geom.nheads, geom.headdim, geom.dstate) if isinstance(geom, Mamba2Geometry)
                   else (geom.HV, geom.V, geom.K))
    state = torch.zeros(2, *state_shape, dtype=STATE)
    if isinstance(geom, Mamba2Geometry):
        from baselines.mamba2_ssu import selective_state_update as step
    else:
        step = importlib.import_module(f"baselines.{family_of(geom)}_recurrent").fused_recurrent_step
    model = _model(geom, "baseline_ar")(geom, 4, 2)
    yield "step", lambda mark: step(state, **_args(geom)), model


# (module, cache class) of each spec method, by family; the module has spec_verify / spec_commit (/ spec_reset).
SPEC_MODULES: dict[str, dict[str, tuple[str, str]]] = {
    "native": {"mamba2": ("baselines.mamba2_ssu", "SpecStates"),
               "gdn": ("baselines.gdn_recurrent_spec", "SpecStates"),
               "kda": ("baselines.kda_recurrent_spec", "SpecStates")},
    "commit_replay": {"mamba2": ("baselines.mamba2_commit_replay", "CommitReplayCache"),
                      "gdn": ("baselines.gdn_commit_replay", "CommitReplayCache"),
                      "kda": ("baselines.kda_commit_replay", "CommitReplayCache")},
    "replay": {"mamba2": ("replayssm.mamba2.spec", "SpecRing"),
               "gdn": ("replayssm.gdn.spec", "SpecRing"),
               "kda": ("replayssm.kda", "SpecRing")},
}


def _spec_module(geom, kind: str):
    module, cls = SPEC_MODULES[kind][family_of(geom)]
    mod = importlib.import_module(module)
    return mod, getattr(mod, cls)


def _commit(mod, cache, accepted, args):
    kwargs = {"A": args["A"]} if "A" in args and "A" in mod.spec_commit.__code__.co_varnames else {}
    mod.spec_commit(cache, torch.tensor([accepted], dtype=torch.int32), slots=SLOT, backend="triton", **kwargs)


def native_spec(geom):
    mod, Cache = _spec_module(geom, "native")
    cache = Cache.allocate(geom, 2, SPEC_WINDOW, state_dtype=STATE)
    model = _model(geom, "baseline_spec")(geom, SPEC_WINDOW, 4, 2)

    def run(mark):
        args = _args(geom, SPEC_WINDOW)
        mod.spec_verify(cache, **args)
        mark()
        _commit(mod, cache, SPEC_WINDOW, args)
    yield "verify+commit", run, model


def commit_replay_spec(geom):
    mod, Cache = _spec_module(geom, "commit_replay")
    cache = Cache.allocate(geom, 2, SPEC_WINDOW, state_dtype=STATE, act_dtype=ACT)
    fn = _model(geom, "commit_replay_spec")
    for a in range(1, SPEC_WINDOW + 1):
        def run(mark, a=a):
            args = _args(geom, SPEC_WINDOW)
            mod.spec_verify(cache, **args)
            mark()
            _commit(mod, cache, a, args)
        yield f"accepted={a}", run, fn(geom, SPEC_WINDOW, a, 4, 2)


def replay_spec(geom):
    mod, Ring = _spec_module(geom, "replay")
    ring = Ring.allocate(geom, 2, SPEC_HISTORY, SPEC_WINDOW, state_dtype=STATE, act_dtype=ACT)
    mod.spec_reset(ring, backend="triton")
    step_fn = _model(geom, "replay_spec_step")
    cycle = tr.spec_cycle(SPEC_HISTORY, SPEC_WINDOW, SPEC_ACCEPTED)
    # From a reset into the steady cycle, then once round it.
    entered, steps = False, 0
    while True:
        h, flush = int(ring.write_pos[1]), bool(ring.is_flush[1])
        if (h, flush) == cycle[0]:
            if entered:
                break
            entered = True

        def run(mark):
            args = _args(geom, SPEC_WINDOW)
            mod.spec_verify(ring, **args)
            mark()
            _commit(mod, ring, SPEC_ACCEPTED, args)
        yield _label(h, flush), run, step_fn(geom, SPEC_WINDOW, h, flush, 4, 2)
        steps += 1
        if steps > 4 * (SPEC_HISTORY + SPEC_WINDOW):
            raise RuntimeError("the ring never reached the model's steady cycle")


METHODS: dict[str, tuple[str, Callable]] = {
    "mamba2.replay[output_only]": ("mamba2", replay_ar("output_only")),
    "mamba2.replay[state_and_output]": ("mamba2", replay_ar("state_and_output")),
    "mamba2.ssu": ("mamba2", baseline_ar),
    "mamba2.ssu_spec": ("mamba2", native_spec),
    "mamba2.commit_replay": ("mamba2", commit_replay_spec),
    "mamba2.replay_spec": ("mamba2", replay_spec),
    "gdn.replay": ("gdn", replay_ar(None)),
    "gdn.recurrent": ("gdn", baseline_ar),
    "gdn.recurrent_spec": ("gdn", native_spec),
    "gdn.commit_replay": ("gdn", commit_replay_spec),
    "gdn.replay_spec": ("gdn", replay_spec),
    "kda.replay": ("kda", replay_ar(None)),
    "kda.recurrent": ("kda", baseline_ar),
    "kda.recurrent_spec": ("kda", native_spec),
    "kda.commit_replay": ("kda", commit_replay_spec),
    "kda.replay_spec": ("kda", replay_spec),
}

# Per-step rows whose model is a cycle mean only: the cycle row is what the model states for these.
CYCLE_METHODS = {"mamba2.replay[output_only]", "mamba2.replay[state_and_output]", "gdn.replay", "kda.replay",
                 "mamba2.replay_spec", "gdn.replay_spec", "kda.replay_spec"}


def measure(method: str, geo_name: str, geom) -> list[Row]:
    family, steps = METHODS[method]
    rows: list[Row] = []
    with TrafficCounter() as counter:
        for label, run, model in steps(geom):
            counter.clear()
            run(counter.mark)
            read, write, reuse, rereads, unknown = count_step(counter)
            rows.append(Row(method, geo_name, label, read, write, model.read, model.write, rereads, reuse,
                            note=("unattributed: " + ",".join(sorted(unknown))) if unknown else ""))
    if method in CYCLE_METHODS:
        cyc = rows
        if method.endswith("replay_spec"):
            cycle = tr.spec_cycle(SPEC_HISTORY, SPEC_WINDOW, SPEC_ACCEPTED)
            first = next(i for i, r in enumerate(rows) if r.step == _label(*cycle[0]))
            cyc = rows[first:first + len(cycle)]
            model = _model(geom, "replay_spec")(geom, SPEC_HISTORY, SPEC_WINDOW, SPEC_ACCEPTED, 4, 2)
        else:
            route = method[method.find("[") + 1:-1] if "[" in method else None
            model = (tr.mamba2_replay_ar_cycle(geom, AR_BUFFER, route, 4, 2) if family == "mamba2"
                     else _model(geom, "replay_ar_cycle")(geom, AR_BUFFER, 4, 2))
        n = len(cyc)
        rows.append(Row(method, geo_name, f"cycle mean ({n} steps)", sum(r.read for r in cyc) / n,
                        sum(r.write for r in cyc) / n, model.read, model.write,
                        max(r.state_rereads for r in cyc), sum(r.reuse for r in cyc) / n))
    return rows


def _label(h: int, flush: bool) -> str:
    return f"h={h}" + (" flush" if flush else "")


def format_table(rows: list[Row], tolerance: float) -> str:
    head = ["method", "geometry", "step", "read", "model read", "d read", "write", "model write", "d write",
            "state rereads", "L2 reuse", "verdict"]
    cells = []
    for r in rows:
        dr, dw = r.diffs()
        cells.append([r.method, r.geometry, r.step, f"{r.read:,.0f}", f"{r.model_read:,.0f}", f"{100 * dr:.2f}%",
                      f"{r.write:,.0f}", f"{r.model_write:,.0f}", f"{100 * dw:.2f}%", f"{r.state_rereads:.2f}",
                      f"{r.reuse:,.0f}",
                      ("ok" if r.ok(tolerance) else "DIFFERS") + (f" ({r.note})" if r.note else "")])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])


def kda_beside_gdn(rows: list[Row], geometries: dict) -> list[tuple[Row, Row]]:
    """(GDN row, KDA row) pairs of the same method and step at geometries of one head shape (HV, K, V): each
    KDA geometry is paired with the first GDN geometry of its head shape in the run. Per-step fill rows (h=..)
    are left out: the summary rows (cycle mean, one step, verify+commit, each accepted count) carry the ratio."""
    shape = lambda g: (g.HV, g.K, g.V)  # noqa: E731
    pairs = []
    for kda_name, kda_geom in geometries.items():
        if family_of(kda_geom) != "kda":
            continue
        gdn_name = next((n for n, g in geometries.items() if family_of(g) == "gdn" and shape(g) == shape(kda_geom)),
                        None)
        if gdn_name is None:
            continue
        gdn_rows = {(r.method.split(".", 1)[1], r.step): r for r in rows if r.geometry == gdn_name}
        for r in rows:
            if r.geometry == kda_name and not r.step.startswith("h="):
                match = gdn_rows.get((r.method.split(".", 1)[1], r.step))
                if match is not None:
                    pairs.append((match, r))
    return pairs


def format_pairs(pairs: list[tuple[Row, Row]]) -> str:
    """KDA's counted bytes beside GDN's at the same head shape, and the ratio of read + write."""
    head = ["method", "step", "GDN geometry", "GDN bytes", "KDA geometry", "KDA bytes", "KDA / GDN"]
    cells = [[k.method.split(".", 1)[1], k.step, g.geometry, f"{g.read + g.write:,.0f}", k.geometry,
              f"{k.read + k.write:,.0f}", f"{(k.read + k.write) / (g.read + g.write):.3f}"] for g, k in pairs]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])


def parse_args(argv=None) -> argparse.Namespace:
    names = sorted(SMALL) + sorted(ALL_MODELS)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--geometry", action="append", choices=names + ["small"],
                   help="geometry (repeatable; 'small' = the three small ones; default: those and every model)")
    p.add_argument("--method", action="append", choices=sorted(METHODS), help="method (repeatable; default all)")
    p.add_argument("--arch", type=int, default=0, choices=(0, 90, 100),
                   help="launch table to run in the interpreter (0: interpreter tiles; 90/100: the GPU's)")
    p.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest relative difference (default 0.03)")
    p.add_argument("--csv", type=Path, help="also write the rows as CSV")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        print("kernel_traffic: needs TRITON_INTERPRET=1 (the counter hooks the interpreter)", file=sys.stderr)
        return 2
    if args.arch:
        os.environ["REPLAYSSM_TARGET_ARCH"] = str(args.arch)
    torch.manual_seed(0)
    wanted = args.geometry or ["small", *sorted(ALL_MODELS)]
    geometries = {}
    for name in wanted:
        if name == "small":
            geometries.update(SMALL)
        else:
            geometries[name] = SMALL[name] if name in SMALL else get_geometry(name)
    rows: list[Row] = []
    for geo_name, geom in geometries.items():
        family = family_of(geom)
        for method, (fam, _) in METHODS.items():
            if fam != family or (args.method and method not in args.method):
                continue
            rows.extend(measure(method, geo_name, geom))
            print(f"  {geo_name} {method}: {len(rows)} rows", file=sys.stderr, flush=True)
    print(format_table(rows, args.tolerance))
    pairs = kda_beside_gdn(rows, geometries)
    if pairs:
        print("\nKDA beside GDN at the same head shape (HV, K, V), counted read + write bytes per step:")
        print(format_pairs(pairs))
    print("\nNot counted (the model leaves them out): " + "; ".join(f"{k} ({v})" for k, v in EXCLUDED.items()))
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([r.__dict__ for r in rows]).to_csv(args.csv, index=False)
    bad = [r for r in rows if not r.ok(args.tolerance)]
    if bad:
        print(f"FAIL: {len(bad)} row(s) differ from the model by more than {100 * args.tolerance:g} % "
              "or re-read the state", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
