"""backend="cpu" with more than one OpenMP thread. The suite runs torch (and so the C kernels) on one thread
(tests/conftest.py); here every method's benchmark cycle (benchmarks/cpu_cases.py: AR cycles through a flush,
spec verify + commit under a changing accepted pattern) runs on the tiny models at one and at two threads.
A program owns one (row, head) and computes it the same way whichever thread runs it, so outputs and every
cache tensor must be equal bit for bit: a race (two programs writing one scratch row, a cursor advanced
before every program has read it) or a prefetch that reads past an allocation shows up here."""

from __future__ import annotations

import pytest
import torch

from benchmarks.cpu_cases import build, cases

TINY = {"mamba2": "tiny_mamba2", "gdn": "tiny_gdn", "kda": "tiny_kda"}
BATCH = 5                 # 5 rows x 4 heads: the two threads' chunks split a row


def _tensors(obj) -> dict[str, torch.Tensor]:
    """A cache's tensors by name (a baseline AR cache is the state tensor itself)."""
    if isinstance(obj, torch.Tensor):
        return {"state": obj}
    return {k: v for k, v in vars(obj).items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("family,method,route", cases("cpu"), ids=lambda v: v if isinstance(v, str) else "-")
def test_two_threads_equal_one(family, method, route):
    before = torch.get_num_threads()
    runs = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            case = build(family, method, route, "cpu", model=TINY[family], batch=BATCH)
            if case.backend != "cpu":
                pytest.skip(f"{family} {method} runs on {case.backend} under backend=cpu")
            case.out.fill_(float("nan"))
            case.cycle()
            runs[threads] = case
    finally:
        torch.set_num_threads(before)
    one, two = runs[1], runs[2]
    assert _tensors(one.cache), "no cache tensor to compare"
    assert not torch.isnan(one.out).any(), "a live output was left unwritten"
    assert torch.equal(one.out, two.out)
    for name, t in _tensors(one.cache).items():
        assert torch.equal(t, _tensors(two.cache)[name]), f"cache.{name} differs between 1 and 2 threads"
