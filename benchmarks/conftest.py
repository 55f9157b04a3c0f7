"""CPU micro-benchmarks (make bench-cpu): pytest-benchmark timings plus a ratio table at the end.

Each benchmark records its per-step median in RESULTS; the terminal summary prints measured speedups
(baseline / ReplaySSM, rows of this same session) beside the byte model's ratio for the same dtypes.
"""

from __future__ import annotations

import os

# The torch backend is timed here; Triton is not involved, but keep the interpreter flag consistent.
os.environ.setdefault("TRITON_INTERPRET", "1")

RESULTS: dict[str, dict] = {}
RATIOS: list[dict] = []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not RATIOS:
        return
    import torch

    tr = terminalreporter
    tr.section("ReplaySSM CPU micro-benchmark: measured vs byte-model speedup")
    tr.write_line(f"torch {torch.__version__}, threads {torch.get_num_threads()}, backend=torch (CPU)")
    header = f"{'family':8} {'geometry':34} {'batch':>5} {'L':>3} {'baseline ms':>12} {'replay ms':>10} " \
             f"{'flush ms':>9} {'measured':>9} {'bytes':>7}"
    tr.write_line(header)
    for r in RATIOS:
        tr.write_line(f"{r['family']:8} {r['geometry']:34} {r['batch']:>5} {r['L']:>3} {r['baseline_ms']:>12.2f} "
                      f"{r['replay_ms']:>10.2f} {r['flush_ms']:>9.2f} {r['measured']:>8.2f}x {r['model']:>6.2f}x")
        tr.write_line(f"         baseline: {r['baseline_form']}, replay: {r['replay_form']}")
