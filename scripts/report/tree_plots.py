"""python scripts/report/tree_plots.py TREE_RUN_DIR: the tree-verify run's table and figure
(experiments/report/figures/tree.py)."""

import sys

from experiments.report.figures.tree import main

if __name__ == "__main__":
    sys.exit(main())
