"""A hybrid model's whole decode step: batch x context length x SSM method (baseline vs ReplaySSM AR).

    python -m experiments.e2e_decode                                       # CPU default (sweep=e2e_cpu)
    python -m experiments.e2e_decode sweep=paper_e2e                        # GPU: the published conditions
    python -m experiments.e2e_decode model=nemotron3_ultra_550b           # one model (the sweep's TP split)
    python -m experiments.e2e_decode sweep.models=[nemotron3_nano_4b@tp8] sweep.batch=[1,8]

Random weights at the model's real dims (rows say weights=random), the layer pattern from conf/model; a
model too large to build is composed from one block (composed=true, composition says how). Rows:
<run dir>/e2e_rows.csv (ms/step = verify + commit, tokens/s, SSM share of the time and of the step's analytic
bytes, cache_resident, peak memory); the work is experiments.hybrid.run.
"""

import hydra

from experiments.harness.sweeps import register_schemas
from experiments.hybrid.run import hydra_main

register_schemas()   # any sweep composes; a sweep of another experiment is refused by name before any work


@hydra.main(version_base="1.3", config_path="../conf", config_name="e2e_decode")
def main(cfg) -> str:
    return hydra_main(cfg, "e2e_decode")


if __name__ == "__main__":
    main()
