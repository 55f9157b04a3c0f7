"""python scripts/kernels/dram_traffic.py --out dram.csv: DRAM bytes from Nsight Compute's counters
beside the byte model, one point per method, on a GPU (experiments/report/kernels/dram.py)."""

import sys

from experiments.report.kernels.dram import main

if __name__ == "__main__":
    sys.exit(main())
