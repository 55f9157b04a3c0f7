"""python scripts/kernels/kernel_report.py [--geometry NAME]... [--tp N] [--target 90|100]...: every
Triton kernel built ahead of time for sm_90 / sm_100 on a CPU; registers, spills, load widths
(experiments/report/kernels/aot.py, recipes.py, report_cli.py). Run without TRITON_INTERPRET."""

import sys

from experiments.report.kernels.report_cli import main

if __name__ == "__main__":
    sys.exit(main())
