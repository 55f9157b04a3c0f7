"""The time budget of a run (`budget:` in conf/config.yaml; `BUDGET_MIN=N make reproduce` sets it): a deadline
that stops a sweep cleanly before its next point, and the claims-first order of its points.

The estimate printed before a GPU paper sweep starts is experiments/budget_estimate.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# ------------------------------------------------------------------------------------ claims-first order

def claim_rank(point, claims) -> int:
    """0: the point is a stated setting of a headline claim; 1: of any claim; 2: it answers none. A claim's
    setting is its experiment, model (if named), batch, buffer_len and spec_T (those it states). `claims`:
    experiments.published.CLAIMS (passed in: the harness imports nothing above it)."""
    rank = 2
    for c in claims:
        stated = [(c.batch, point.batch), (c.buffer_len, point.buffer_len or getattr(point, "history_len", None)),
                  (c.spec_T, point.spec_T)]
        if c.experiment != point.experiment or not any(want is not None for want, _ in stated):
            continue
        if c.models and not any(point.model.startswith(m) for m in c.models):
            continue
        if all(want is None or want == got for want, got in stated):
            rank = min(rank, 0 if c.headline else 1)
    return rank


def claims_first(points: list, claims) -> list:
    """The points in claim-rank order (stable: the sweep's own order within a rank)."""
    return sorted(points, key=lambda p: claim_rank(p, claims))


@dataclass(frozen=True)
class Budget:
    """`budget:` of the config: deadline (unix seconds, null: none), claims_first (order points by claim)."""

    deadline: float | None = None
    claims_first: bool = False

    @classmethod
    def of(cls, data: dict) -> Budget:
        b = data.get("budget") or {}
        deadline = b.get("deadline")
        if deadline is not None and not isinstance(deadline, (int, float)):
            raise ValueError(f"budget.deadline: {deadline!r}; expected unix seconds or null")
        return cls(deadline=float(deadline) if deadline is not None else None,
                   claims_first=bool(b.get("claims_first", False)))

    def expired(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    def order(self, points: list, claims) -> list:
        """`points` claims first when the config asks for it (`claims`: experiments.published.CLAIMS), else
        as they are."""
        return claims_first(points, claims) if self.claims_first else list(points)
