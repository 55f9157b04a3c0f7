"""backend="cpu" (replayssm/cpu): what the oracle tests of each method do not cover: the on-disk build cache,
and bad input refused with a clear error before any work. The kernels themselves are checked against the
float64 oracles in each method's own test file (backend parametrisations include "cpu")."""

from __future__ import annotations

import pytest
import torch

from replayssm.cpu import build, ops
from replayssm.geometry import Mamba2Geometry
from replayssm.mamba2.cache import ReplayCache
from replayssm.mamba2.decode import replay_step

GEOM = Mamba2Geometry(nheads=2, headdim=8, dstate=16, ngroups=1)


def test_library_is_built_once_and_reused():
    lib = build.build()
    stamp = lib.stat().st_mtime_ns
    assert build.build() == lib and lib.stat().st_mtime_ns == stamp          # a cache hit: no rebuild
    assert build.cache_root() in lib.parents
    assert torch.float32 in ops.supported_dtypes() and torch.bfloat16 in ops.supported_dtypes()


def _inputs(batch=2):
    return dict(x=torch.randn(batch, 2, 8), dt=torch.randn(batch, 2), A=-torch.rand(2), B=torch.randn(batch, 1, 16),
                C=torch.randn(batch, 1, 16))


def test_fp8_state_is_refused_before_any_work():
    cache = ReplayCache.allocate(GEOM, 2, 4, state_dtype=torch.float8_e4m3fn)
    before = cache.write_pos.clone()
    # refused by check_backend (no fp8 state kernels) or by check_backend_format (the format, naming the C ones)
    with pytest.raises(ValueError, match="backend='cpu' has no (fp8 state kernels|kernels for state format "
                                         "'float8_e4m3fn': it supports .*float16_sr, bfloat16_sr)"):
        replay_step(cache, **_inputs(), backend="cpu")
    assert torch.equal(cache.write_pos, before)


def test_missing_fp16_kernels_are_a_clear_error(monkeypatch):
    monkeypatch.setattr(ops, "has_fp16", lambda: False)       # a compiler without _Float16
    cache = ReplayCache.allocate(GEOM, 2, 4, act_dtype=torch.float16)
    inp = {k: (v.half() if k in ("x", "B", "C") else v) for k, v in _inputs().items()}
    with pytest.raises(ValueError, match="backend='cpu' has no kernel for .* dtype torch.float16"):
        replay_step(cache, **inp, backend="cpu")
    assert int(cache.write_pos.sum()) == 0


def test_oversized_ring_is_refused():
    with pytest.raises(ValueError, match="ring_len=128 exceeds 64"):
        ops.check_cpu_sizes(ring_len=128)


def test_window_past_the_stack_arrays_is_refused():
    """A ring of 64 rows can hold a window of 17-32; the C spec kernels keep per-token scalars in 16-long
    arrays, so the window is refused before the verify touches the ring."""
    from replayssm.mamba2.cache import SpecRing
    from replayssm.mamba2.spec import spec_verify

    T = 20
    ring = SpecRing.allocate(GEOM, 2, 32, T)
    inp = {k: v.unsqueeze(1).expand(v.shape[0], T, *v.shape[1:]).contiguous() if k != "A" else v
           for k, v in _inputs().items()}
    before = ring.write_pos.clone()
    with pytest.raises(ValueError, match="spec window T=20 exceeds 16"):
        spec_verify(ring, **inp, backend="cpu")
    assert torch.equal(ring.write_pos, before)
