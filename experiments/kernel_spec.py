"""One SSM layer, speculative verify + commit: batch x T x acceptance x model x method.

    python -m experiments.kernel_spec                                     # CPU sweep on this box
    python -m experiments.kernel_spec model=qwen35_122b_a10b sweep=paper
    python -m experiments.kernel_spec sweep=smoke 'sweep.acceptance=[{kind: fixed, accepted: all}]'

A spec time covers the acceptance model's cadence, early flushes included (mean per step); tokens_per_s =
batch x mean accepted / step time. Standard AR decode (baseline_ar) is timed in the same run, so speedups
over standard decoding come from one run. The work is `run_experiment(cfg)`; Hydra only composes cfg.
"""

import hydra

from experiments.harness.entry import hydra_entry
from experiments.harness.sweeps import register_schemas
from experiments.kernel.run import run_experiment, summarize

register_schemas()   # any sweep composes; a sweep of another experiment is refused by name before any work


@hydra.main(version_base="1.3", config_path="../conf", config_name="kernel_spec")
def main(cfg) -> str:
    return hydra_entry(cfg, run_experiment, summarize)


if __name__ == "__main__":
    main()
