"""One SSM layer, autoregressive decode: batch x buffer_len x model x dtype x method.

    python -m experiments.kernel_decode                                   # CPU sweep on this box
    python -m experiments.kernel_decode model=nemotron3_super_120b sweep=paper
    python -m experiments.kernel_decode --multirun model=tiny_mamba2,tiny_gdn sweep=cpu

Each ReplaySSM time covers whole flush cycles (L steps from write_pos 0, mean per step) and the flush step's
own time is recorded beside it. Rows: results/<hardware>/<run-id>/rows.csv (experiments/harness/store.py).
The work is `experiments.kernel.run.run_experiment(cfg)`, a plain function; Hydra only composes cfg.
"""

import hydra

from experiments.harness.entry import hydra_entry
from experiments.harness.sweeps import register_schemas
from experiments.kernel.run import run_experiment, summarize

register_schemas()   # any sweep composes; a sweep of another experiment is refused by name before any work


@hydra.main(version_base="1.3", config_path="../conf", config_name="kernel_decode")
def main(cfg) -> str:
    return hydra_entry(cfg, run_experiment, summarize)


if __name__ == "__main__":
    main()
