"""What `make bench-cpu` times: every method of the registry at the issue's CPU geometries, through the same
plumbing a sweep uses (experiments/harness/methods.py: allocate, step / verify + commit, traffic).

    Mamba-2  Nemotron-3-Super-120B (128 heads, headdim 64, dstate 128, 8 groups)
    GDN      Qwen3.5-122B-A10B     (H 16, HV 64, K = V = 128)
    KDA      Kimi-Linear-48B-A3B   (H = HV = 32, K = V = 128; GDN's C kernels in their per-channel mode)
batch 32, fp32 state and activations, AR buffer L = 16, spec window T = 4 with history B = 16, accepted
counts a deterministic pattern 1 + (row + step) mod T (mean 2.5). One layer: its state alone (128 MiB;
Kimi-Linear's 64 MiB) is past the caches of the CPUs measured so far (a 32 MiB L3; a 480 MiB one whose usable
share per core is far smaller), so every step streams from DRAM; the row's roofline says what the box reached.

A case is (family, method, route) -> a cycle (AR: L steps from an empty buffer, the flush included; spec:
STEPS verify + commit steps from a reset ring) and the byte model of a step (replayssm/traffic.py via the
method's own traffic(), bytes per step per sequence x batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from experiments.harness.methods import REGISTRY
from experiments.harness.points import Point, load_model_config, model_spec
from experiments.harness.workload import Workload
from replayssm import traffic

BATCH = 32
BUFFER_LEN = 16
WINDOW = 4
HISTORY = 16
SPEC_STEPS = 10
MODELS = {"mamba2": "nemotron3_super_120b", "gdn": "qwen35_122b_a10b", "kda": "kimi_linear_48b_a3b"}
AR_METHODS = [("baseline_ar", None), ("replay_ar", "output_only"), ("replay_ar", "state_and_output")]
SPEC_METHODS = ["baseline_spec", "commit_replay_spec", "replay_spec"]


@dataclass
class Case:
    family: str
    method: str
    route: str | None
    backend: str           # what the method runs under backend=<asked> (registry backend_for)
    cycle: object          # () -> None
    steps: int             # steps per cycle
    bytes_per_step: float  # byte model x batch
    partner: str | None    # the method this one's speedup is measured against
    row_steps: list        # Traffic of every (row, step) of one cycle: the roofline's input (replayssm/cpu/roofline.py)
    cache: object = None   # what the cycle steps on, and the output it writes (tests compare them across threads)
    out: torch.Tensor | None = None

    @property
    def label(self) -> str:
        return self.method + (f"[{self.route}]" if self.route else "")


def _point(family: str, method: str, route: str | None, backend: str, kind: str, model: str,
           batch: int) -> tuple[Point, object]:
    spec = model_spec(load_model_config(model), None)
    p = Point(experiment=f"bench_{kind}", family=family, model=spec.name, tp=1, method=method, route=route,
              backend=backend, batch=batch, buffer_len=BUFFER_LEN if kind == "ar" else None,
              spec_T=WINDOW if kind == "spec" else None, history_len=HISTORY if kind == "spec" else None,
              acceptance=None, state_dtype="float32", act_dtype="float32", context_len=None, timing_mode="eager",
              l2="cold", torch_compile="false", slot_layout="identity", device="cpu", seed=0)
    return p, spec


def accepted_pattern(steps: int = SPEC_STEPS, batch: int = BATCH, T: int = WINDOW) -> torch.Tensor:
    """[steps, batch] int32 accepted counts (bonus token included): 1 + (row + step) mod T."""
    s = torch.arange(steps)[:, None]
    b = torch.arange(batch)[None, :]
    return (1 + (s + b) % T).to(torch.int32)


def _traffic(method, p, wl, accepted, batch: int) -> float:
    ns = SimpleNamespace(family=wl.family, geometry=wl.geometry, state_dtype=wl.state_dtype, act_dtype=wl.act_dtype)
    t = method.traffic(p, ns, accepted)
    return float(t.total) * batch


def build(family: str, method_name: str, route: str | None, backend: str, model: str | None = None,
          batch: int = BATCH) -> Case:
    """The case at the benchmark's geometry (MODELS[family]) and batch, or at `model` / `batch` (tests run the
    same cycles on the tiny models)."""
    method = REGISTRY[method_name]
    kind = method.kind
    used = method.backend_for(backend, family)
    p, spec = _point(family, method_name, route, used, kind, model or MODELS[family], batch)
    gen = torch.Generator().manual_seed(0)
    wl = Workload(spec, p, "cpu", gen)
    cache = method.allocate(p, wl, batch, "cpu")
    method.set_state(cache, wl.random_state(batch))
    fns = method.api(family)
    if kind == "ar":
        kw = wl.call_kwargs(wl.inputs(batch))
        out = wl.out(batch)
        steps = BUFFER_LEN if method.uses_buffer else 1
        cursor = method.flush_cursor(cache)

        def cycle():
            if cursor is not None:
                cursor.zero_()
            for _ in range(steps):
                method.step(fns, cache, p, kw, None, out)

        accepted = None
    else:
        kw = wl.call_kwargs(wl.inputs(batch, window=WINDOW))
        out = wl.out(batch, window=WINDOW)
        accepted = accepted_pattern(batch=batch)
        A = wl.params.get("A")
        reset = getattr(method.module(family), "spec_reset", None)
        steps = SPEC_STEPS

        def cycle():
            if reset is not None:
                reset(cache, backend=used)
            for s in range(steps):
                method.verify(fns, cache, p, kw, None, out)
                method.commit(fns, cache, p, accepted[s], None, A)

    return Case(family, method_name, route, used, cycle, steps, _traffic(method, p, wl, accepted, batch),
                method.partner, row_steps(family, method_name, route, wl.geometry, accepted, batch), cache, out)


def row_steps(family: str, method: str, route: str | None, geom, accepted: torch.Tensor | None,
              batch: int = BATCH) -> list:
    """The byte model of every (row, step) a cycle runs, in the order the kernels meet them. AR rows move in
    lockstep (every row flushes at step L - 1); spec rows follow the ring protocol from a reset under the
    accepted pattern: verify at (write_pos, is_flush), then write_pos = a after a flush step, else += a, and
    is_flush = write_pos + 2T > B + T (replayssm/traffic.py spec_cycle)."""
    tr = {"mamba2": (traffic.mamba2_baseline_ar, traffic.mamba2_replay_ar, traffic.mamba2_baseline_spec,
                     traffic.mamba2_commit_replay_spec, traffic.mamba2_replay_spec_step),
          "gdn": (traffic.gdn_baseline_ar, traffic.gdn_replay_ar, traffic.gdn_baseline_spec,
                  traffic.gdn_commit_replay_spec, traffic.gdn_replay_spec_step),
          "kda": (traffic.kda_baseline_ar, traffic.kda_replay_ar, traffic.kda_baseline_spec,
                  traffic.kda_commit_replay_spec, traffic.kda_replay_spec_step)}[family]
    base_ar, replay_ar, base_spec, cr_spec, replay_spec = tr
    b = {"state_bytes": 4, "act_bytes": 4}                     # fp32 state and activations
    if method == "baseline_ar":
        return [base_ar(geom, **b)] * batch
    if method == "replay_ar":
        extra = {"route": route} if family == "mamba2" else {}
        return [replay_ar(geom, BUFFER_LEN, h, **extra, **b) for h in range(BUFFER_LEN) for _ in range(batch)]
    if method == "baseline_spec":
        return [base_spec(geom, WINDOW, **b)] * (batch * SPEC_STEPS)
    if method == "commit_replay_spec":
        return [cr_spec(geom, WINDOW, int(a), **b) for a in accepted.flatten()]
    out = []
    for row in range(batch):
        wp, flush = 0, 2 * WINDOW > HISTORY + WINDOW
        for step in range(SPEC_STEPS):
            out.append(replay_spec(geom, WINDOW, wp, flush, **b))
            a = int(accepted[step, row])
            wp = a if flush else wp + a
            flush = wp + 2 * WINDOW > HISTORY + WINDOW
    return out


def cases(backend: str) -> list[tuple[str, str, str | None]]:
    out = []
    for family in MODELS:
        for name, route in AR_METHODS:
            if route is None or route in REGISTRY[name].routes(family):
                out.append((family, name, route))
        out += [(family, name, None) for name in SPEC_METHODS]
    return out

