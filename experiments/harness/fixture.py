"""One point's cache, state, slots and inputs, built one way for everything that runs a point: the gate
(harness/check.py), the timed stack (kernel/run.py), the tuner's phases (tune.py), the launch floor, the
DRAM stage (report/kernels/dram.py) and the accuracy study.

Two things make a point look like a serving batch rather than a benchmark:

- The pool (`num_slots`) is separate from the batch: a server holds more sequences' caches than it decodes
  in one step, so the batch's rows map to a random subset of a larger pool (`sweep.pool_factor`), and a
  kernel's slot indirection really gathers.
- The rows' cursors need not agree (`sweep.cursors`). `aligned` (every row at write position 0: the whole
  batch flushes on the same step, the layout every earlier row was timed in), `staggered` (row r at
  r * period // rows: write positions spread evenly over the cycle, so about batch / L rows fold on each
  step, as in a batch whose sequences started at different times), or `h=k` (every row at position k).

A cursor layout is reached by running the method itself, not by writing cursor fields: row r takes
target[r] single-token steps (AR: one step; spec: a window committed with one accepted token) through the
public API on a slot subset before the point is checked or timed. The cache is then one that real decoding
produces, whatever its cursor fields mean, and the float64 oracle (`oracle=True`) follows every primed step,
so the gate checks a staggered batch as strictly as an aligned one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from experiments.harness.methods import Method
from experiments.harness.serving_shape import cursor_period, cursor_targets, parse_cursors, pool_factor
from experiments.harness.workload import Workload


@dataclass
class PointFixture:
    """A point's cache(s) and inputs. `slots` [rows] int32 (None: row r is slot r, the methods' fast path);
    `kw` / `inputs` / `out` one AR step or one spec window of `rows` rows; `ref_state` [rows, *state] float64
    after the primed steps (oracle=True only); `targets` the primed steps per row."""

    method: Method
    fns: dict
    wl: Workload
    p: object
    rows: int
    num_slots: int
    slots: torch.Tensor | None
    targets: list[int]
    oracle: bool
    fast_state: bool
    caches: list = field(default_factory=list)
    ref_state: torch.Tensor | None = None
    inputs: dict | None = None
    kw: dict | None = None
    out: torch.Tensor | None = None

    @classmethod
    def build(cls, method: Method, fns: dict, wl: Workload, p, rows: int | None = None, *, cursors=None,
              oracle: bool = False, fast_state: bool = False, state: torch.Tensor | None = None,
              with_inputs: bool = True) -> PointFixture:
        """The first cache of point `p` with `rows` rows (default p.batch) in a pool of the point's size
        scaled to `rows` (p.num_slots / p.batch of it), primed to the cursor layout `cursors` (default the
        point's), plus one step's (or window's) inputs and a NaN-poisoned output (`with_inputs`; a caller
        that brings its own inputs leaves the workload's generator untouched). `fast_state` draws the state
        on the device (a GPU stack of many layers), else from the workload's generator; `state`
        [num_slots, *state_shape] is set instead of a drawn one (the accuracy study: one S0 for every method)."""
        rows = p.batch if rows is None else rows
        num_slots = rows * pool_factor(p)
        layout = getattr(p, "cursors", None) if cursors is None else parse_cursors(cursors, "cursors")
        fx = cls(method=method, fns=fns, wl=wl, p=p, rows=rows, num_slots=num_slots,
                 slots=wl.slots(rows, num_slots, p.slot_layout),
                 targets=cursor_targets(layout, rows, cursor_period(method, p)), oracle=oracle,
                 fast_state=fast_state)
        window = p.spec_T if method.kind == "spec" else None
        fx.add_cache(state)
        if not with_inputs:
            return fx
        fx.inputs = wl.inputs(rows, window=window)
        fx.kw = wl.call_kwargs(fx.inputs)
        fx.out = wl.out(rows, window=window)
        return fx

    @property
    def order(self) -> torch.Tensor:
        """[rows] int64: the slot each row reads and writes."""
        if self.slots is None:
            return torch.arange(self.rows, device=self.wl.device)
        return self.slots.long()

    def add_cache(self, state: torch.Tensor | None = None):
        """Allocate one more cache (a layer of a stack) with a fresh state (or `state`), primed like the first."""
        m, wl, p = self.method, self.wl, self.p
        cache = m.allocate(p, wl, self.num_slots, wl.device)
        if state is None:
            state = wl.random_state(self.num_slots, on_device=self.fast_state)
        m.set_state(cache, state)
        if self.oracle and not self.caches:
            self.ref_state = state.double()[self.order]          # row r starts from slot order[r]
        self.prime(cache, self.targets, track=self.oracle and not self.caches)
        self.caches.append(cache)
        return cache

    def prime(self, cache, targets: list[int], track: bool = False) -> None:
        """Take each row targets[r] single-token steps through the method's own API (slot subsets); `track`
        advances the float64 oracle's rows alike."""
        m, wl, p = self.method, self.wl, self.p
        order = self.order
        for k in range(max(targets, default=0)):
            active = torch.tensor([r for r, t in enumerate(targets) if t > k], device=wl.device)
            n, sub = len(active), order[active].to(torch.int32)
            if m.kind == "ar":
                inp = wl.inputs(n)
                m.step(self.fns, cache, p, wl.call_kwargs(inp), sub, wl.out(n))
                if track:
                    self.ref_state[active], _ = wl.oracle_step(self.ref_state[active], inp)
                continue
            win = wl.inputs(n, window=p.spec_T)
            ones = torch.ones(n, dtype=torch.int32, device=wl.device)
            m.verify(self.fns, cache, p, wl.call_kwargs(win), sub, wl.out(n, window=p.spec_T))
            m.commit(self.fns, cache, p, ones, sub, wl.params.get("A"))
            if track:
                states, _ = wl.oracle_window(self.ref_state[active], win)
                self.ref_state[active] = states[:, 0]                  # one accepted token
