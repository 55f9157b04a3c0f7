"""Speculative serving through a hybrid model: window T = 1 + drafts, modes ar / native / replayssm /
commit_replay, the MTP drafter timed, acceptance from experiments/harness/acceptance.py.

    python -m experiments.serving                                          # CPU default (sweep=serving_cpu)
    python -m experiments.serving sweep=paper_serving                       # GPU: batch to 512, T = 4 and 6
    python -m experiments.serving model=qwen35_122b_a10b                    # one model (the sweep's TP split)

throughput = batch x mean accepted length / (draft_us + verify_us + commit_us), each phase a row column;
max_concurrency is the number of sequences whose KV cache + SSM caches fit the HBM budget after the served
checkpoint's weights (analytic footprint, experiments/hybrid/footprint.py; vLLM's allocator: python -m
experiments.hybrid.footprint). Rows: <run dir>/serving_rows.csv; the work is experiments.hybrid.run.
"""

import hydra

from experiments.harness.sweeps import register_schemas
from experiments.hybrid.run import hydra_main

register_schemas()   # any sweep composes; a sweep of another experiment is refused by name before any work


@hydra.main(version_base="1.3", config_path="../conf", config_name="serving")
def main(cfg) -> str:
    return hydra_main(cfg, "serving")


if __name__ == "__main__":
    main()
