"""python scripts/report/hybrid_plots.py RUN_DIR [--out DIR]: the whole-model figures alone
(experiments/report/figures/hybrid.py)."""

import sys

from experiments.report.figures.hybrid import main

if __name__ == "__main__":
    sys.exit(main())
