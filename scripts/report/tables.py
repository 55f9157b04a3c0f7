"""python scripts/report/tables.py RUN_DIR [--out FILE] [--quiet]: every table of a run -> RUN_DIR/TABLES.md
and stdout (experiments/report/tables.py)."""

import sys

from experiments.report.tables import main

if __name__ == "__main__":
    sys.exit(main())
