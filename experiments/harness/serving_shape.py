"""The serving shape of a point, as rules (experiments/harness/fixture.py builds it): which cursor layouts a
sweep may ask for, how many single-token steps make one cycle of a method's cursor, where each row starts,
and how large the pool is beside the batch. It needs only the method table, so the sweep's validation
(points.py) and the fixture share it without an import circle (the fixture needs the workload, which needs
points.py).
"""

from __future__ import annotations

import re

from experiments.harness.methods import Method

CURSOR_LAYOUTS = ("aligned", "staggered")          # or "h=<k>": every row at write position k
_FIXED = re.compile(r"^h=(\d+)$")


def parse_cursors(value, key: str = "sweep.cursors") -> str:
    """'aligned', 'staggered', or a fixed position (an int k or 'h=k') -> its canonical name."""
    if value in CURSOR_LAYOUTS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"h={value}"
    if isinstance(value, str) and _FIXED.match(value):
        return value
    raise ValueError(f"{key}: expected 'aligned', 'staggered', or a write position h >= 0 ('h=3' or 3), "
                     f"got {value!r}")


def cursor_period(method: Method, p) -> int | None:
    """How many single-token steps take a row through one cycle of its cursor: L for an AR buffer; for a
    spec ring of history B and window T, the B - T + 2 one-token commits between two early flushes. None
    for a method without a cursor (the baselines and peers, whose rows carry no cursor layout)."""
    if method.kind == "ar":
        return p.buffer_len if method.uses_buffer else None
    return p.history_len - p.spec_T + 2 if method.uses_history else None


def cursor_targets(layout: str | None, rows: int, period: int | None) -> list[int]:
    """Single-token steps row r takes before the point runs: [rows] ints in [0, period)."""
    if period is None or layout in (None, "aligned"):
        return [0] * rows
    if layout == "staggered":
        return [r * period // rows for r in range(rows)]
    h = int(_FIXED.match(layout).group(1))
    if h >= period:
        raise ValueError(f"cursors={layout}: a write position must be below the cursor's period {period}")
    return [h] * rows


def pool_factor(p) -> int:
    """Slots in the pool per decoded row (1: the pool is exactly the batch)."""
    num_slots = getattr(p, "num_slots", None)
    if not num_slots:
        return 1
    if num_slots % p.batch:
        raise ValueError(f"num_slots={num_slots} is not a multiple of batch={p.batch}")
    return num_slots // p.batch
