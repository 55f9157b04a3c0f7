"""python scripts/report/paper_figures.py RUN_DIR [--out DIR]: the blog's Figs. 6-11 with the published
markers (experiments/report/figures/paper.py)."""

import sys

from experiments.report.figures.paper import main

if __name__ == "__main__":
    sys.exit(main())
