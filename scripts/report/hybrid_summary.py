"""python scripts/report/hybrid_summary.py RUN_DIR: the whole-model (e2e_decode, serving) ratios of a
run -> RUN_DIR/hybrid_summary.csv (experiments/report/hybrid.py)."""

import sys

from experiments.report.hybrid import main

if __name__ == "__main__":
    sys.exit(main())
