"""python scripts/report/aggregate.py RUN_DIR [RUN_DIR ...]: pair each run's rows into ratios;
writes summary.csv and counts.csv into each run directory (experiments/report/runs.py)."""

import sys

from experiments.report.runs import main

if __name__ == "__main__":
    sys.exit(main())
