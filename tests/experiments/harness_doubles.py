"""Helpers for the harness tests: fast CPU configs composed from conf/, and test-double methods.

The doubles are registered in the method registry only for the test that asks for them:
    test:wrong   baseline_ar whose output is off by 1 %: the gate must record status=wrong, no time
    test:raises  a step that raises RuntimeError: status=error, the sweep goes on
    test:oom     an allocation that raises torch.OutOfMemoryError: status=oom
and scheduled_drafts, a drafter for the greedy speculative loops whose rejections are placed by construction.
"""

from __future__ import annotations

import torch

from experiments.harness import methods
from experiments.harness.entry import load_config

# Small and quick: one repeat set of a few samples, short spec cycles, a tiny copy-bandwidth probe.
FAST = [
    "timing.cpu_repeats=3", "timing.cpu_warmup=1", "timing.cpu_min_sample_us=0", "timing.spec_steps=6",
    "timing.copy_bytes=1048576", "timing.cpu_cold_probe=off", "progress=false",
]


def compose(tmp_path, experiment: str = "kernel_decode", overrides=()):
    """A composed config writing under tmp_path, tiny models, one batch, short buffers and windows."""
    base = [f"out_dir={tmp_path}", "sweep=cpu", "sweep.models=[tiny_mamba2,tiny_gdn]", "sweep.batch=[2]",
            "sweep.buffer_len=[3]", "sweep.spec_T=[2]", "sweep.history_len=[3]"]
    return load_config(experiment, base + FAST + list(overrides))


class WrongBaseline(methods.BaselineAR):
    name, families = "test:wrong", ("mamba2",)

    def step(self, fns, cache, p, kw, slots, out):
        y = super().step(fns, cache, p, kw, slots, out)
        return y.mul_(1.01)                       # 1 % off: far above the fp32 tolerance (1e-5)


class RaisingBaseline(methods.BaselineAR):
    name, families = "test:raises", ("mamba2",)

    def step(self, fns, cache, p, kw, slots, out):
        raise RuntimeError("boom: a kernel that fails to compile")


class OOMBaseline(methods.BaselineAR):
    name, families = "test:oom", ("mamba2",)

    def allocate(self, p, wl, num_slots, device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")


def scheduled_drafts(ar: torch.Tensor, done: torch.Tensor, k: int, window: int, vocab: int,
                     gen: torch.Generator) -> torch.Tensor:
    """k drafts per row continuing the AR tokens ar [batch, n] after each row's emitted count done [batch],
    wrong from a scheduled position on: row r of window `window` keeps (window + r) % (k + 1) leading drafts
    right, so the window accepts that many + 1 tokens. By construction, not by chance: every count 1..k+1
    occurs within k + 1 consecutive windows of a row (in one window when batch >= k + 1), rows of a window
    accept different counts (batch <= k + 1), and every window with a count < k + 1 rolls drafts back.
    A wrong draft is a random token other than the right one (so it can never be accepted by luck); past the
    end of ar the "right" drafts repeat its last token (and may be rejected)."""
    rows = torch.arange(done.shape[0])
    good = ar.gather(1, (done[:, None] + torch.arange(k)).clamp(max=ar.shape[1] - 1))
    keep = (window + rows) % (k + 1)
    wrong = (good + torch.randint(1, vocab, good.shape, generator=gen)) % vocab
    return torch.where(torch.arange(k)[None, :] < keep[:, None], good, wrong)
