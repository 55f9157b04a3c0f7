"""Tune the Mamba-2 spec verify tiles on this GPU, state-safely, and print the table entries to keep.

For each production Mamba-2 geometry (or --geometry), a ring of --batch rows (history 16, window 4, fp32
state, bf16 activations; half the rows flush) is filled with random data and spec_verify is timed under every
candidate of the tile space (replayssm/mamba2/spec_kernels.py: dstate chunk x warps x window padding, the
spilling ones already dropped) by replayssm/mamba2/spec_tuning.py, which restores everything a trial touched.
Three geometries take about a minute, mostly compiling the candidates. Prints one row per candidate and the
`TUNED_SPEC_TILES` entries of the fastest, keyed by ((headdim, dstate, window), arch), to paste into
spec_kernels.py with this run's hardware and versions in the commit message.

Usage: python scripts/kernels/tune_spec_tiles.py [--geometry NAME]... [--batch N] [--csv PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from replayssm.checks import kernel_arch
from replayssm.geometry import MAMBA2_MODELS, get_geometry
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.mamba2.spec import spec_reset
from replayssm.mamba2.spec_tuning import best, tune_spec_tiles

HISTORY, WINDOW = 16, 4


def tune_geometry(name: str, batch: int, device: str, gen: torch.Generator):
    geo = get_geometry(name)
    ring = SpecRing.allocate(geo, batch, HISTORY, WINDOW, act_dtype=torch.bfloat16, device=device)
    ring.state.copy_(random_state(geo, batch, generator=gen))
    spec_reset(ring)
    ring.write_pos.copy_(torch.randint(0, HISTORY - WINDOW + 1, (batch,), generator=gen, dtype=torch.int32))
    ring.is_flush.copy_((torch.arange(batch) % 2).to(torch.int32))
    ring.x.normal_()
    ring.B.normal_()
    ring.dt.uniform_(0.01, 0.1)
    p = random_params(geo, device=device, generator=gen)
    x = random_step(geo, batch, act_dtype=torch.bfloat16, window=WINDOW, device=device, generator=gen)
    inputs = dict(x=x["x"], dt=x["dt"], A=p.A, B=x["B"], C=x["C"], D=p.D, z=x["z"], dt_bias=p.dt_bias)
    return geo, tune_spec_tiles(ring, inputs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--geometry", action="append", choices=sorted(MAMBA2_MODELS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_spec_tiles: needs a CUDA GPU (the interpreter's timings mean nothing)", file=sys.stderr)
        return 2
    arch = kernel_arch("cuda")
    gen = torch.Generator().manual_seed(0)
    rows, entries = [], []
    for name in args.geometry or sorted(MAMBA2_MODELS):
        geo, trials = tune_geometry(name, args.batch, "cuda", gen)
        for t in trials:
            rows.append(dict(geometry=name, arch=arch, tiles=t.config.label, ms=t.ms, error=t.error))
            print(f"{name:22s} sm_{arch} {t.config.label:24s} "
                  + (f"{t.ms:.4f} ms" if t.ms is not None else f"rejected: {t.error}"))
        chosen = best(trials).config
        entries.append(f"    (({geo.headdim}, {geo.dstate}, {WINDOW}), {arch}): {chosen!r},   # {name}")
    print("\nTUNED_SPEC_TILES entries (fastest per geometry):\n" + "\n".join(entries))
    if args.csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
