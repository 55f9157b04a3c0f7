"""replayssm.checks.trusted_inputs: the host-synced value checks run once (warm-up), never in timed repeats.

The value checks read tensors back to the host (a sync on a GPU); inside `trusted_inputs()` they are skipped
exactly as during graph capture, while shape/dtype/device checks still run. The harness's timers run their
timed repeats trusted, after untrusted first calls.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.harness import timing
from replayssm import checks

READBACK_OPS = {"aten.min.default", "aten.max.default", "aten._unique2.default", "aten.unique_dim.default",
                "aten._local_scalar_dense.default"}


class ReadBacks(TorchDispatchMode):
    """Counts the aten ops that read values back to the host (what a value check does)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in READBACK_OPS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_value_checks_skipped_only_inside_trusted_inputs():
    bad = torch.tensor([0, 7], dtype=torch.int32)               # slot 7 of a 4-slot pool
    with pytest.raises(ValueError, match="slot out of range"):
        checks.check_slots(bad, 2, 4, bad.device)
    with pytest.raises(ValueError, match="num_accepted must be in 1..T=4"):
        checks.check_num_accepted(torch.tensor([0, 2]), 2, 4)
    good = torch.tensor([1, 3], dtype=torch.int32)
    with ReadBacks() as untrusted:
        checks.check_slots(good, 2, 4, good.device)
    assert untrusted.seen, "an untrusted check_slots must read the slot values"
    with checks.trusted_inputs(), ReadBacks() as trusted:
        assert checks.skip_value_checks()
        checks.check_slots(bad, 2, 4, bad.device)                # skipped: no error, no read-back
        checks.check_num_accepted(torch.tensor([0, 2]), 2, 4)
        with pytest.raises(ValueError, match="slots must be int32 or int64"):
            checks.check_slots(bad.float(), 2, 4, bad.device)    # dtype checks still run
    assert trusted.seen == []
    assert not checks.skip_value_checks()                         # the block ends, checks are back


def test_a_trusted_block_is_left_even_on_error():
    with pytest.raises(RuntimeError), checks.trusted_inputs():
        raise RuntimeError("boom")
    assert not checks.skip_value_checks()


@pytest.mark.parametrize("timer", ["time_cpu", "time_cpu_prepared"])
def test_cpu_timers_run_checks_first_and_trust_the_timed_repeats(timer):
    seen: list[bool] = []
    step = lambda: seen.append(checks.skip_value_checks())
    if timer == "time_cpu":
        timing.time_cpu(step, 1, warmup=1, repeats=3, min_sample_us=0)
        first, timed = seen[:2], seen[2:]                        # the probe call and one warm-up call
    else:
        timing.time_cpu_prepared(lambda: None, step, 1, warmup=1, repeats=3)
        first, timed = seen[:1], seen[1:]
    assert first and not any(first), "the first calls must run every value check"
    assert timed and all(timed), "the timed repeats must not time host-synced value checks"
