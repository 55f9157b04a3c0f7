"""Shared helpers of the tree-speculation tests: random trees and branches, and one adapter per family
(ring, random window, tree/chain calls, committed state, a float64 serial step for the accepted tokens)."""

from __future__ import annotations

import math

import torch

from replayssm import gdn, mamba2
from replayssm.gdn.inputs import random_state as gdn_state
from replayssm.gdn.inputs import random_step as gdn_step
from replayssm.geometry import GDNGeometry, Mamba2Geometry
from replayssm.mamba2.inputs import random_params, random_state
from replayssm.mamba2.inputs import random_step as m2_step
from replayssm.mamba2.ref import process_dt


def chain(n: int) -> list[int]:
    return [-1] + list(range(n - 1))


def star(n: int) -> list[int]:
    return [-1] + [0] * (n - 1)


def full_binary(n: int) -> list[int]:
    return [-1] + [(s - 1) // 2 for s in range(1, n)]


def random_tree(n: int, gen: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, s, (1,), generator=gen)) for s in range(1, n)]


SHAPES = {"chain": lambda n, g: chain(n), "star": lambda n, g: star(n), "binary": lambda n, g: full_binary(n),
          "random": random_tree}


def depth_of(parents: list[int]) -> int:
    d = [0] * len(parents)
    for s in range(1, len(parents)):
        d[s] = d[parents[s]] + 1
    return max(d) + 1


def random_branch(parents: list[int], gen: torch.Generator) -> list[int]:
    """Node 0, then a random child at each level until a leaf."""
    path = [0]
    while True:
        kids = [s for s in range(len(parents)) if parents[s] == path[-1]]
        if not kids:
            return path
        path.append(kids[int(torch.randint(0, len(kids), (1,), generator=gen))])


def random_commit(trees: list[list[int]], depth: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(path int32 [batch, depth] padded with -1, num_accepted [batch] in 1..len(branch))."""
    path = torch.full((len(trees), depth), -1, dtype=torch.int32)
    acc = torch.empty(len(trees), dtype=torch.int32)
    for b, par in enumerate(trees):
        br = random_branch(par, gen)
        path[b, : len(br)] = torch.tensor(br, dtype=torch.int32)
        acc[b] = int(torch.randint(1, len(br) + 1, (1,), generator=gen))
    return path, acc


class Mamba2Family:
    name = "mamba2"
    mod = mamba2
    fields = ("x", "B", "dt", "state")

    def __init__(self, gen: torch.Generator, nheads=4, headdim=8, dstate=16, ngroups=2):
        self.geo = Mamba2Geometry(nheads=nheads, headdim=headdim, dstate=dstate, ngroups=ngroups)
        self.gen = gen
        self.p = random_params(self.geo, generator=gen)

    def ring(self, num_slots: int, history_len: int, window: int, act_dtype=torch.float32, state_dtype=torch.float32):
        r = mamba2.SpecRing.allocate(self.geo, num_slots, history_len, window, state_dtype=state_dtype,
                                     act_dtype=act_dtype)
        r.state.copy_(random_state(self.geo, num_slots, generator=self.gen))
        return r

    def window(self, batch: int, n: int, act_dtype=torch.float32) -> dict:
        return m2_step(self.geo, batch, act_dtype=act_dtype, window=n, generator=self.gen)

    def verify(self, ring, w, parents, backend, slots=None, out=None):
        p = self.p
        return mamba2.tree_verify(ring, w["x"], w["dt"], p.A, w["B"], w["C"], p.D, w["z"], p.dt_bias,
                                  parents=parents, slots=slots, out=out, backend=backend)

    def chain_verify(self, ring, w, backend, slots=None):
        p = self.p
        return mamba2.spec_verify(ring, w["x"], w["dt"], p.A, w["B"], w["C"], p.D, w["z"], p.dt_bias,
                                  slots=slots, backend=backend)

    def committed(self, ring, slots) -> torch.Tensor:
        return mamba2.spec_materialize(ring, slots, backend="torch", A=self.p.A).double()

    def serial(self, state: torch.Tensor, w: dict, b: int, nodes: list[int]) -> torch.Tensor:
        """state float64 [nheads, headdim, dstate] advanced by the window tokens `nodes` of row b."""
        dtp = process_dt(w["dt"][b], self.p.dt_bias, True)
        hpg = self.geo.heads_per_group
        S = state.clone()
        for s in nodes:
            for hd in range(self.geo.nheads):
                d = dtp[s, hd]
                S[hd] = math.exp(float(self.p.A[hd]) * float(d)) * S[hd] + d * torch.outer(
                    w["x"][b, s, hd].double(), w["B"][b, s, hd // hpg].double())
        return S


class GDNFamily:
    name = "gdn"
    mod = gdn
    fields = ("u", "k", "g", "state")

    def __init__(self, gen: torch.Generator, H=2, HV=4, K=16, V=8):
        self.geo = GDNGeometry(H=H, HV=HV, K=K, V=V)
        self.gen = gen

    def ring(self, num_slots: int, history_len: int, window: int, act_dtype=torch.float32, state_dtype=torch.float32):
        r = gdn.SpecRing.allocate(self.geo, num_slots, history_len, window, state_dtype=state_dtype,
                                  act_dtype=act_dtype)
        r.state.copy_(gdn_state(self.geo, num_slots, generator=self.gen))
        return r

    def window(self, batch: int, n: int, act_dtype=torch.float32) -> dict:
        return gdn_step(self.geo, batch, act_dtype=act_dtype, window=n, generator=self.gen)

    def verify(self, ring, w, parents, backend, slots=None, out=None):
        return gdn.tree_verify(ring, **w, parents=parents, slots=slots, out=out, backend=backend)

    def chain_verify(self, ring, w, backend, slots=None):
        return gdn.spec_verify(ring, **w, slots=slots, backend=backend)

    def committed(self, ring, slots) -> torch.Tensor:
        return gdn.spec_materialize(ring, slots, backend="torch").double()

    def serial(self, state: torch.Tensor, w: dict, b: int, nodes: list[int]) -> torch.Tensor:
        """state float64 [HV, V, K] advanced by the delta rule over the window tokens `nodes` of row b."""
        grp = self.geo.value_heads_per_key_head
        S = state.clone()
        for s in nodes:
            for hv in range(self.geo.HV):
                k = w["k"][b, s, hv // grp].double()
                e = math.exp(float(w["g"][b, s, hv]))
                u = float(w["beta"][b, s, hv]) * (w["v"][b, s, hv].double() - e * (S[hv] @ k))
                S[hv] = e * S[hv] + torch.outer(u, k)
        return S


FAMILIES = {"mamba2": Mamba2Family, "gdn": GDNFamily}
