"""Tune the launch configs of the speculative kernels on this GPU: a thin front of `python -m experiments.tune
--experiment kernel_spec` (the Mamba-2 spec tile space is now one of the tuner's spaces, kernel
"mamba2_replay_spec"; the tuner writes the device's launch table, replayssm/launch_tables/<gpu>.json, instead of
printing TUNED_SPEC_TILES entries to paste).

Usage: python scripts/kernels/tune_spec_tiles.py [--all] [--out DIR] [-- HYDRA OVERRIDES...]
"""

from __future__ import annotations

import sys

from experiments import tune


def main(argv=None) -> int:
    return tune.main(["--experiment", "kernel_spec", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
