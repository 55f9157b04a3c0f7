"""python scripts/report/accuracy.py RUN_DIR: the accuracy study's tables (bf16 table, growth exponents,
verdicts) from RUN_DIR/accuracy.csv (experiments/report/accuracy.py)."""

import sys

from experiments.report.accuracy import main

if __name__ == "__main__":
    sys.exit(main())
