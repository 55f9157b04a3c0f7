"""python scripts/report/plots.py RUN_DIR [--out DIR] [--no-paper]: every figure of a run ->
RUN_DIR/plots/*.png with FIGURES.md (experiments/report/figures/plots.py)."""

import sys

from experiments.report.figures.plots import main

if __name__ == "__main__":
    sys.exit(main())
