"""python scripts/report/claims.py RUN_DIR [RUN_DIR ...] [--out FILE]: every published claim against the
runs' rows -> REPORT.md of the first run (experiments/report/claims.py)."""

import sys

from experiments.report.claims import main

if __name__ == "__main__":
    sys.exit(main())
