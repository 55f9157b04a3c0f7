"""Acceptance models for speculative decoding: how many of a window's T tokens a verify step accepts.

Counts follow vLLM's convention: `accepted` includes the bonus token, so it lies in 1..T
(acceptance length = 1 + accepted drafts). Three models, all seeded:

    fixed   every row accepts the same count every step (`accepted: 3`, or `all` = T)
    rate    i.i.d. per-draft acceptance with probability p; accepted = 1 + leading successes
    table   per-position conditional acceptance: draft i (0-based) is accepted with probability table[i]
            given that drafts 0..i-1 were (positions past the table reuse its last entry)
    workload  a named, published per-position acceptance profile of a real drafter (WORKLOADS below), sampled
            as a table of its conditional rates; a window longer than the profile is refused (no extrapolation)

A spec entry is a dict ({kind: rate, p: 0.8}, {kind: workload, name: mtp_gsm8k_qwen3next}) or its label
string ("rate:0.8", "fixed:all", "table:0.9/0.7/0.5", "workload:mtp_gsm8k_qwen3next"); `label` is what the
`acceptance` column of a row holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

KINDS = ("fixed", "rate", "table", "workload")


@dataclass(frozen=True)
class Workload:
    """A published per-position acceptance profile. `published` holds the numbers as the source prints them
    (fractions), `definition` says which: "conditional" (draft k accepted given drafts 0..k-1 were) or
    "share_of_drafts" (vLLM's per-position acceptance: the share of all drafts whose position k was accepted,
    i.e. P(at least k+1 drafts accepted), non-increasing in k). results/published/cells.csv carries the same
    numbers (metric acceptance_rate_pos_<k>); a test keeps the two equal."""

    source: str
    published: tuple[float, ...]
    definition: str

    @property
    def conditional(self) -> tuple[float, ...]:
        """Per-position conditional rates, the `table` kind's form: c_0 = a_0, c_k = a_k / a_(k-1)."""
        if self.definition == "conditional":
            return self.published
        a = self.published
        return (a[0],) + tuple(a[k] / a[k - 1] for k in range(1, len(a)))


# Published MTP drafter profiles on GSM8K at temperature 0 (greedy), from vLLM-project pull requests.
WORKLOADS: dict[str, Workload] = {
    # vllm-project/speculators PR #366, "Results (GSM8K math reasoning, num_speculative_tokens=3)", base (original)
    # MTP head of Qwen3-Next-80B-A3B-Instruct (a GDN hybrid): Pos0 0.873, Pos1 0.778, Pos2 0.675, MeanAccepted
    # 2.01. Conditional: 0.873 + 0.873*0.778 + 0.873*0.778*0.675 = 2.01. Covers T <= 4 (the blog's window).
    "mtp_gsm8k_qwen3next": Workload("vllm-project/speculators PR #366", (0.873, 0.778, 0.675), "conditional"),
    # vllm-project/vllm PR #48892, "GSM8K, Concurrency = 64, Temperature = 0", MTP 8 (Inkling's multi-module
    # MTP), per-position acceptance (%) 75.68 60.11 49.76 41.13 35.38 29.80 26.08 22.29, acceptance length 4.40
    # (= 1 + their sum). vLLM's per-position metric is a share of drafts. Covers T <= 9.
    "mtp8_gsm8k_inkling": Workload("vllm-project/vllm PR #48892",
                                   (0.7568, 0.6011, 0.4976, 0.4113, 0.3538, 0.2980, 0.2608, 0.2229),
                                   "share_of_drafts"),
}


@dataclass(frozen=True)
class Acceptance:
    """A validated acceptance model. `accepted` is an int or "all" (fixed only); `probs` for rate/table."""

    kind: str
    accepted: int | str | None = None
    probs: tuple[float, ...] = ()
    name: str | None = None                   # workload only

    @property
    def label(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.accepted}"
        if self.kind == "rate":
            return f"rate:{self.probs[0]:g}"
        if self.kind == "workload":
            return f"workload:{self.name}"
        return "table:" + "/".join(f"{p:g}" for p in self.probs)

    def check_window(self, T: int, key: str = "acceptance") -> None:
        """A workload covers only the positions its source published: T - 1 drafts must not exceed them."""
        if self.kind == "workload" and T - 1 > len(self.probs):
            raise ValueError(f"{key}: workload {self.name!r} publishes {len(self.probs)} draft positions "
                             f"(T <= {len(self.probs) + 1}); T={T} would extrapolate it")

    def _position_probs(self, T: int) -> list[float]:
        """Probability that draft i (0..T-2) is accepted given all earlier drafts were."""
        if self.kind == "rate":
            return [self.probs[0]] * (T - 1)
        self.check_window(T)
        return [self.probs[min(i, len(self.probs) - 1)] for i in range(T - 1)]

    def fixed_count(self, T: int) -> int:
        """The count a fixed model accepts at window T (clamped to T: a sweep may pair 3 with T=2)."""
        n = T if self.accepted == "all" else int(self.accepted)
        return min(n, T)

    def sample(self, T: int, batch: int, steps: int, generator: torch.Generator) -> torch.Tensor:
        """Accepted counts int32 [steps, batch], each in 1..T."""
        if self.kind == "fixed":
            return torch.full((steps, batch), self.fixed_count(T), dtype=torch.int32)
        probs = torch.tensor(self._position_probs(T), dtype=torch.float64)        # [T-1]
        draws = torch.rand(steps, batch, T - 1, generator=generator, dtype=torch.float64)
        success = (draws < probs).to(torch.int32)
        leading = torch.cumprod(success, dim=-1).sum(-1)                           # leading successes
        return (1 + leading).to(torch.int32)

    def expected(self, T: int) -> float:
        """Expected accepted count (bonus included) at window T."""
        if self.kind == "fixed":
            return float(self.fixed_count(T))
        survive, total = 1.0, 1.0
        for p in self._position_probs(T):
            survive *= p
            total += survive
        return total


def _prob(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}: expected a probability in [0, 1], got {value!r}")
    value = float(value)
    if not (0.0 <= value <= 1.0) or math.isnan(value):
        raise ValueError(f"{key}: acceptance probability must lie in [0, 1], got {value}")
    return value


def _from_label(key: str, text: str) -> dict:
    kind, _, arg = text.partition(":")
    if kind == "fixed":
        return {"kind": "fixed", "accepted": arg if arg == "all" else _int_text(key, arg)}
    if kind == "rate":
        return {"kind": "rate", "p": _float_text(key, arg)}
    if kind == "table":
        return {"kind": "table", "table": [_float_text(key, a) for a in arg.split("/") if a]}
    if kind == "workload":
        return {"kind": "workload", "name": arg}
    raise ValueError(f"{key}: unknown acceptance kind {kind!r}; expected one of {KINDS}")


def _int_text(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{key}: expected an int accepted count or 'all', got {text!r}") from None


def _float_text(key: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{key}: expected a number, got {text!r}") from None


def parse_acceptance(spec, key: str = "acceptance") -> Acceptance:
    """Validate one acceptance entry (dict or label string); errors name `key`."""
    if isinstance(spec, str):
        spec = _from_label(key, spec)
    if not isinstance(spec, dict):
        raise ValueError(f"{key}: expected a dict like {{kind: rate, p: 0.8}} or a label, got {spec!r}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{key}.kind: unknown acceptance kind {kind!r}; expected one of {KINDS}")
    if kind == "fixed":
        n = spec.get("accepted")
        if n != "all" and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"{key}.accepted: expected an int >= 1 (bonus token included) or 'all', got {n!r}")
        return Acceptance("fixed", accepted=n)
    if kind == "rate":
        return Acceptance("rate", probs=(_prob(f"{key}.p", spec.get("p")),))
    if kind == "workload":
        name = spec.get("name")
        if name not in WORKLOADS:
            raise ValueError(f"{key}.name: unknown acceptance workload {name!r}; expected one of {tuple(WORKLOADS)}")
        return Acceptance("workload", probs=WORKLOADS[name].conditional, name=name)
    table = spec.get("table")
    if not isinstance(table, (list, tuple)) or not table:
        raise ValueError(f"{key}.table: expected a non-empty list of per-position probabilities, got {table!r}")
    return Acceptance("table", probs=tuple(_prob(f"{key}.table[{i}]", p) for i, p in enumerate(table)))
