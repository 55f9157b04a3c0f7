"""TRITON_INTERPRET=1 python scripts/kernels/kernel_traffic.py [--geometry small|NAME]...: every kernel's counted
HBM bytes beside the byte model, under the interpreter (experiments/report/kernels/traffic.py)."""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")     # before anything imports triton: the counter hooks the interpreter

from experiments.report.kernels.traffic import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
