"""ctypes entry points of the fused CPU kernels (kernels_body.h, spec_body.h, tree_body.h): tensors in, nothing
allocated per step.

Each function takes the same tensors as the public API it serves (validated there) and calls one C kernel
that loops over (row, head) with OpenMP on torch.get_num_threads() threads. Inputs are made contiguous
(a no-op for the harness's inputs); the caches must be contiguous (they are allocated so). `out` is written
in place when contiguous, else through a contiguous temporary.

    mamba2_ssu(state [S, H, P, N], x [b, H, P], dt [b, H], A [H], B, C [b, G, N], D, z, dt_bias, softplus,
               out [b, H, P], slots int32 [b], store=None)
    mamba2_replay(cache (replayssm.mamba2.ReplayCache), x, dt, A, B, C, D, z, dt_bias, softplus, out, slots,
                  route)
    gdn_step(state [S, HV, V, K], q, k [b, H, K], v [b, HV, V], g, beta [b, HV], scale, l2norm, out, slots,
             store=None)
    gdn_replay(cache (replayssm.gdn.ReplayCache), q, k, v, g, beta, scale, l2norm, out, slots)
        both serve KDA too: g [b, HV, K] (a decay per key channel) and a replayssm.kda.ReplayCache (g
        [S, HV, L, K]) select the kernels' per-channel mode (pc = 1); GDN's g [b, HV] the scalar one
    spec, window inputs [b, T, ...] (each function's docstring has its cache):
    mamba2_spec_native / gdn_spec_native (per-draft snapshots), mamba2_cr_verify / mamba2_cr_commit and
    gdn_cr_verify / gdn_cr_commit (commit-replay), mamba2_spec_replay / gdn_spec_replay (the ReplaySSM ring)
    mamba2_tree_replay / gdn_tree_replay(ring, <the chain spec inputs with T = N tree nodes>, parents int32 [b, N])
The gdn_* spec and tree functions also run Kimi Delta Attention (replayssm.kda, baselines.kda_*): the same
kernels with a per-key-channel decay (pc = 1), chosen here from the tensors (_per_channel): a KDA cache's g has
one more dim than GDN's (a [K] row per entry) and the window's g is [b, T, HV, K] instead of [b, T, HV].

Stochastic rounding (float16_sr / bfloat16_sr, replayssm/state_format.py): the four AR kernels (mamba2_ssu,
mamba2_replay, gdn_step, gdn_replay) store such a state themselves, with the bits of sr_round_torch (the C Philox
and rounding in kernels.c). The replay caches carry their format, counter and seed; a baseline's FormattedState
comes in as `store`. The kernel reads the slot's counter sr_step and advances it by one per write of the slot
(every live row of a baseline step, the flush rows of a replay step), as the Triton kernels and write_state do.
"""

from __future__ import annotations

import ctypes

import torch

from replayssm.cpu.build import has_fp16, library
from replayssm.state_format import format_of

DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
MAX_DIM = 1024      # kernels_body.h keeps a row of this many fp32 on the stack per program
MAX_LEN = 64        # MAXL: buffer / ring length
SR_BITS_MASK = 0xFFFFFFFF   # ANDs every SR draw in the kernels; a test sets 0 (a deterministic-rounding mutant)
SR_FORMAT_CODE = {"float16_sr": 1, "bfloat16_sr": 2}   # kernels.c's SR_F16 / SR_BF16


def supported_dtypes() -> tuple[torch.dtype, ...]:
    """Storage dtypes the built library has kernels for (fp16 needs the compiler's _Float16)."""
    return (torch.float32, torch.bfloat16) + ((torch.float16,) if has_fp16() else ())


def check_cpu_dtypes(**tensors: torch.Tensor | torch.dtype | None) -> None:
    """A clear error before any work when a state / activation dtype has no CPU kernel."""
    ok = supported_dtypes()
    for name, t in tensors.items():
        dtype = t if isinstance(t, torch.dtype) or t is None else t.dtype
        if dtype is not None and dtype not in ok:
            hint = "" if dtype != torch.float16 else " (this C compiler has no _Float16)"
            raise ValueError(f"backend='cpu' has no kernel for {name} dtype {dtype}; supported: "
                             f"{[str(d) for d in ok]}{hint}")


def check_cpu_sizes(**sizes: int) -> None:
    for name, n in sizes.items():
        limit = MAX_LEN if name in ("buffer_len", "ring_len", "window") else MAX_DIM
        if n > limit:
            raise ValueError(f"backend='cpu': {name}={n} exceeds {limit} (a row is kept on the kernel's stack)")


_FNS: dict[str, ctypes._CFuncPtr] = {}


def _fn(name: str, state_dtype: torch.dtype, act_dtype: torch.dtype):
    key = f"{name}_{DTYPE_NAMES[state_dtype]}_{DTYPE_NAMES[act_dtype]}"
    fn = _FNS.get(key)
    if fn is None:
        fn = _FNS[key] = getattr(library(), key)
        fn.restype = None
    return fn


def _call(fn, *args) -> None:
    """Call a kernel; tensors become data pointers here, so every temporary (a contiguous or fp32 copy) stays
    referenced by `args` until the kernel returns. None is a NULL pointer, float a C float, int a C int."""
    conv = []
    for a in args:
        if isinstance(a, torch.Tensor):
            conv.append(ctypes.c_void_p(a.data_ptr()))
        elif isinstance(a, float):
            conv.append(ctypes.c_float(a))
        else:
            conv.append(a)
    fn(*conv)


def _c(t: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    if t is None:
        return None
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t.contiguous()


def _out(out: torch.Tensor):
    """(tensor the kernel writes, finaliser copying it back when `out` was not contiguous)."""
    if out.is_contiguous():
        return out, lambda: None
    tmp = out.contiguous()
    return tmp, lambda: out.copy_(tmp)


def _require_contiguous(**caches: torch.Tensor) -> None:
    for name, t in caches.items():
        if not t.is_contiguous():
            raise ValueError(f"backend='cpu' needs contiguous cache tensors; {name} is not")


def _i64(values) -> list[ctypes.c_int64]:
    """Element strides (the state's outer dims may be strided; its last dim is unit-stride, checked by the API)."""
    return [ctypes.c_int64(v) for v in values]


def _threads() -> int:
    return torch.get_num_threads()


def _sr(holder) -> tuple:
    """The kernels' (sr_step, sr_seed, sr_mask) arguments: a float16_sr / bfloat16_sr holder's (a replay cache or
    a baseline's FormattedState) int32 counter and seed, else (NULL, 0, 0): the plain store."""
    if holder is None or not format_of(holder).stochastic:
        return None, ctypes.c_uint32(0), ctypes.c_uint32(0)
    step = holder.sr_step
    if step is None or step.dtype != torch.int32 or not step.is_contiguous() or step.shape != holder.state.shape[:1]:
        raise ValueError("backend='cpu': an SR state needs a contiguous int32 sr_step [num_slots]")
    return step, ctypes.c_uint32(int(holder.sr_seed)), ctypes.c_uint32(SR_BITS_MASK)


def sr_round(x: torch.Tensor, seed: int, slots: torch.Tensor, steps: torch.Tensor, fmt: str) -> torch.Tensor:
    """The kernels' stochastic rounding alone (tests): x [rows, n] float32 -> the stored 16-bit patterns [rows, n]
    (int16), row i drawn with slot slots[i] at step steps[i] ([rows] ints), element j of the row."""
    x = _c(x, torch.float32)
    rows, n = x.shape
    out = torch.empty(rows, n, dtype=torch.int16)
    _call(library().replayssm_cpu_sr_round, x, out, _c(slots, torch.int32), _c(steps, torch.int32), rows,
          ctypes.c_int64(n), ctypes.c_uint32(seed), ctypes.c_uint32(SR_BITS_MASK), SR_FORMAT_CODE[fmt])
    return out


def philox(n: int, elem0: int, slot: int, seed: int, step: int) -> torch.Tensor:
    """The kernels' Philox draws (tests) of elements elem0 .. elem0 + n - 1 (element e: word e mod 4 of counter
    e >> 2, indices mod 2^32), as int64 [n]."""
    out = torch.empty(n, dtype=torch.int32)
    _call(library().replayssm_cpu_philox, out, ctypes.c_int64(n), *(ctypes.c_uint32(v) for v in (elem0, slot, seed,
                                                                                                  step)))
    return out.long() & 0xFFFFFFFF


def mamba2_ssu(state, x, dt, A, B, C, D, z, dt_bias, softplus, out, slots, store=None) -> None:
    """store: the baseline's FormattedState (its SR counter and seed), or None."""
    S, H, P, N = state.shape
    G = B.shape[-2]
    o, done = _out(out)
    _call(_fn("m2_ssu", state.dtype, x.dtype),
        state, _c(x), _c(dt, torch.float32), _c(A), _c(B), _c(C), _c(D), _c(z),
        _c(dt_bias), int(bool(softplus)), o, _c(slots, torch.int32), x.shape[0], H, P, N, G,
          *_i64(state.stride()[:3]), *_sr(store), _threads())
    done()


def mamba2_replay(cache, x, dt, A, B, C, D, z, dt_bias, softplus, out, slots, route: str) -> None:
    _require_contiguous(state=cache.state, x=cache.x, B=cache.B, dt=cache.dt, write_pos=cache.write_pos, bc=cache.bc)
    check_cpu_sizes(buffer_len=cache.buffer_len)
    g = cache.geometry
    o, done = _out(out)
    _call(_fn("m2_replay", cache.state.dtype, cache.x.dtype),
        cache.state, cache.x, cache.B, cache.dt, cache.write_pos, cache.bc,
        _c(x), _c(dt, torch.float32), _c(A), _c(B), _c(C), _c(D), _c(z),
        _c(dt_bias), int(bool(softplus)), o, _c(slots, torch.int32), x.shape[0],
        g.nheads, g.headdim, g.dstate, g.ngroups, cache.buffer_len, 0 if route == "output_only" else 1,
        *_sr(cache), _threads())
    done()


def gdn_step(state, q, k, v, g, beta, scale: float, l2norm: bool, out, slots, store=None) -> None:
    """GDN (g [b, HV]) or KDA (g [b, HV, K], a decay per key channel: the kernel's pc mode), told apart by g.
    store: the baseline's FormattedState (its SR counter and seed), or None."""
    S, HV, V, K = state.shape
    check_cpu_sizes(K=K, V=V)
    o, done = _out(out)
    _call(_fn("gdn_step", state.dtype, q.dtype),
        state, _c(q), _c(k), _c(v), _c(g, torch.float32), _c(beta, torch.float32),
        float(scale), int(bool(l2norm)), o, _c(slots, torch.int32), q.shape[0], q.shape[1], HV,
        K, V, *_i64(state.stride()[:3]), int(g.dim() == 3), *_sr(store), _threads())
    done()


def gdn_replay(cache, q, k, v, g, beta, scale: float, l2norm: bool, out, slots) -> None:
    """cache: replayssm.gdn.ReplayCache, or replayssm.kda.ReplayCache (its g [S, HV, L, K] selects pc mode)."""
    _require_contiguous(state=cache.state, u=cache.u, k=cache.k, g=cache.g, write_pos=cache.write_pos)
    gm = cache.geometry
    check_cpu_sizes(K=gm.K, V=gm.V, buffer_len=cache.buffer_len)
    o, done = _out(out)
    _call(_fn("gdn_replay", cache.state.dtype, cache.u.dtype),
        cache.state, cache.u, cache.k, cache.g, cache.write_pos,
        _c(q), _c(k), _c(v), _c(g, torch.float32), _c(beta, torch.float32),
        float(scale), int(bool(l2norm)), o, _c(slots, torch.int32), q.shape[0], gm.H, gm.HV,
        gm.K, gm.V, cache.buffer_len, int(cache.g.dim() == 4), *_sr(cache), _threads())
    done()


# ------------------------------------------------------------------------------------------------- spec

MAX_WINDOW = 16     # MAXT in spec_body.h


def _per_channel(g: torch.Tensor, K: int, cache_g: torch.Tensor | None = None) -> int:
    """1 for Kimi Delta Attention (window g [b, T, HV, K], cache g [S, HV, rows, K]), 0 for GDN (g [b, T, HV],
    cache g [S, HV, rows]); a window and a cache of different families, or a KDA g whose last dim is not K,
    are refused before any work (the kernel would read the decays with the wrong layout)."""
    if g.dim() not in (3, 4):
        raise ValueError(f"g must be [batch, T, HV] (GDN) or [batch, T, HV, K] (KDA), got {tuple(g.shape)}")
    pc = int(g.dim() == 4)
    if pc and g.shape[-1] != K:
        raise ValueError(f"KDA g must be [batch, T, HV, K={K}], got {tuple(g.shape)}")
    if cache_g is not None and cache_g.dim() != 3 + pc:
        raise ValueError(f"window g {tuple(g.shape)} and cache g {tuple(cache_g.shape)} are of different families "
                         "(GDN: a scalar decay per head, KDA: one per key channel)")
    return pc


def check_cpu_window(window: int) -> None:
    """The spec kernels keep per-token scalars in MAXT-long stack arrays: a longer window is refused before any
    work (a ring of up to MAX_LEN rows could otherwise hold a window that overflows them)."""
    if window > MAX_WINDOW:
        raise ValueError(f"backend='cpu': spec window T={window} exceeds {MAX_WINDOW} (the kernels keep per-token "
                         f"scalars on the stack)")


def mamba2_spec_native(states, x, dt, A, B, C, D, z, dt_bias, softplus, out, slots) -> None:
    """states: baselines.mamba2_ssu.SpecStates (state [S, T, H, P, N], last [S]); window inputs [b, T, ...]."""
    _require_contiguous(state=states.state, last=states.last)
    check_cpu_window(states.window)
    g, T = states.geometry, states.window
    o, done = _out(out)
    _call(_fn("m2_spec_native", states.state.dtype, x.dtype),
          states.state, states.last, None, None, None, _c(x), _c(dt, torch.float32), _c(A, torch.float32), _c(B), _c(C),
          _c(D, torch.float32), _c(z), _c(dt_bias, torch.float32), int(bool(softplus)), o, _c(slots, torch.int32),
          x.shape[0], T, g.nheads, g.headdim, g.dstate, g.ngroups, _threads())
    done()


def mamba2_spec_replay(ring, x, dt, A, B, C, D, z, dt_bias, softplus, out, slots) -> None:
    """ring: replayssm.mamba2.cache.SpecRing; window inputs [b, T, ...]; cursors are left to spec_commit."""
    _require_contiguous(state=ring.state, x=ring.x, B=ring.B, dt=ring.dt, bc=ring.bc, write_pos=ring.write_pos,
                        origin=ring.origin, is_flush=ring.is_flush)
    check_cpu_sizes(ring_len=ring.ring_len, window=ring.window)
    check_cpu_window(ring.window)
    if ring.bc.shape[-1] < ring.window:
        raise ValueError(f"ring.bc holds {ring.bc.shape[-1]} window columns, the window is {ring.window}")
    g, T = ring.geometry, ring.window
    o, done = _out(out)
    _call(_fn("m2_spec_replay", ring.state.dtype, ring.x.dtype),
          ring.state, ring.x, ring.B, ring.dt, ring.bc, ring.write_pos, ring.origin, ring.is_flush,
          _c(x), _c(dt, torch.float32), _c(A, torch.float32), _c(B), _c(C), _c(D, torch.float32), _c(z),
          _c(dt_bias, torch.float32), int(bool(softplus)), o, _c(slots, torch.int32), x.shape[0], T, g.nheads,
          g.headdim, g.dstate, g.ngroups, ring.ring_len, _threads())
    done()


def gdn_spec_native(states, q, k, v, g, beta, scale: float, l2norm: bool, out, slots) -> None:
    """states: baselines.gdn_recurrent_spec.SpecStates or baselines.kda_recurrent_spec.SpecStates (state
    [S, T, HV, V, K], last [S]); g [b, T, HV] (GDN) or [b, T, HV, K] (KDA)."""
    _require_contiguous(state=states.state, last=states.last)
    check_cpu_window(states.window)
    gm, T = states.geometry, states.window
    check_cpu_sizes(K=gm.K, V=gm.V)
    pc = _per_channel(g, gm.K)
    o, done = _out(out)
    _call(_fn("gdn_spec_native", states.state.dtype, q.dtype),
          states.state, states.last, None, None, None, None, _c(q), _c(k), _c(v), _c(g, torch.float32),
          _c(beta, torch.float32), float(scale), int(bool(l2norm)), o, _c(slots, torch.int32), q.shape[0], T, gm.H,
          gm.HV, gm.K, gm.V, pc, _threads())
    done()


def gdn_cr_verify(cache, q, k, v, g, beta, scale: float, l2norm: bool, out, slots) -> None:
    """cache: baselines.gdn_commit_replay.CommitReplayCache or baselines.kda_commit_replay.CommitReplayCache (g
    [S, HV, T, K]): the checkpoint is read, the window stashed."""
    _require_contiguous(state=cache.state, k=cache.k, v=cache.v, g=cache.g, beta=cache.beta)
    check_cpu_window(cache.window)
    gm, T = cache.geometry, cache.window
    check_cpu_sizes(K=gm.K, V=gm.V)
    pc = _per_channel(g, gm.K, cache.g)
    o, done = _out(out)
    _call(_fn("gdn_spec_native", cache.state.dtype, q.dtype),
          cache.state, None, cache.k, cache.v, cache.g, cache.beta, _c(q), _c(k), _c(v), _c(g, torch.float32),
          _c(beta, torch.float32), float(scale), int(bool(l2norm)), o, _c(slots, torch.int32), q.shape[0], T, gm.H,
          gm.HV, gm.K, gm.V, pc, _threads())
    done()


def gdn_cr_commit(cache, num_accepted, slots) -> None:
    """cache: a GDN or KDA CommitReplayCache (KDA: its g [S, HV, T, K] has one more dim)."""
    _require_contiguous(state=cache.state, k=cache.k, v=cache.v, g=cache.g, beta=cache.beta)
    check_cpu_window(cache.window)
    gm, T = cache.geometry, cache.window
    check_cpu_sizes(K=gm.K, V=gm.V)
    if cache.g.dim() not in (3, 4) or (cache.g.dim() == 4 and cache.g.shape[-1] != gm.K):
        raise ValueError(f"cache g must be [S, HV, T] (GDN) or [S, HV, T, K] (KDA), got {tuple(cache.g.shape)}")
    pc = int(cache.g.dim() == 4)
    _call(_fn("gdn_cr_commit", cache.state.dtype, cache.k.dtype),
          cache.state, cache.k, cache.v, cache.g, cache.beta, _c(num_accepted, torch.int32), _c(slots, torch.int32),
          num_accepted.shape[0], T, gm.H, gm.HV, gm.K, gm.V, pc, _threads())


def mamba2_cr_verify(cache, x, dt, A, B, C, D, z, dt_bias, softplus, out, slots) -> None:
    """cache: baselines.mamba2_commit_replay.CommitReplayCache: the checkpoint is read, the window stashed."""
    _require_contiguous(state=cache.state, x=cache.x, B=cache.B, dt=cache.dt)
    check_cpu_window(cache.window)
    g, T = cache.geometry, cache.window
    o, done = _out(out)
    _call(_fn("m2_spec_native", cache.state.dtype, x.dtype),
          cache.state, None, cache.x, cache.B, cache.dt, _c(x), _c(dt, torch.float32), _c(A, torch.float32), _c(B),
          _c(C), _c(D, torch.float32), _c(z), _c(dt_bias, torch.float32), int(bool(softplus)), o,
          _c(slots, torch.int32), x.shape[0], T, g.nheads, g.headdim, g.dstate, g.ngroups, _threads())
    done()


def mamba2_cr_commit(cache, num_accepted, A, slots) -> None:
    _require_contiguous(state=cache.state, x=cache.x, B=cache.B, dt=cache.dt)
    check_cpu_window(cache.window)
    g, T = cache.geometry, cache.window
    _call(_fn("m2_cr_commit", cache.state.dtype, cache.x.dtype),
          cache.state, cache.x, cache.B, cache.dt, _c(num_accepted, torch.int32), _c(A, torch.float32),
          _c(slots, torch.int32), num_accepted.shape[0], T, g.nheads, g.headdim, g.dstate, g.ngroups, _threads())


def gdn_spec_replay(ring, q, k, v, g, beta, scale: float, l2norm: bool, out, slots) -> None:
    """ring: replayssm.gdn.ring.SpecRing or replayssm.kda.SpecRing (g [S, HV, R, K]); window inputs [b, T, ...];
    cursors are left to spec_commit."""
    _require_contiguous(state=ring.state, u=ring.u, k=ring.k, g=ring.g, write_pos=ring.write_pos,
                        origin=ring.origin, is_flush=ring.is_flush)
    check_cpu_sizes(ring_len=ring.ring_len, K=ring.geometry.K, V=ring.geometry.V)
    pc = _per_channel(g, ring.geometry.K, ring.g)
    if 2 * ring.window > MAX_WINDOW:
        raise ValueError(f"backend='cpu': the GDN ReplaySSM verify holds 2T <= {MAX_WINDOW} dot products per row; "
                         f"window T={ring.window}")
    gm, T = ring.geometry, ring.window
    o, done = _out(out)
    _call(_fn("gdn_spec_replay", ring.state.dtype, ring.u.dtype),
          ring.state, ring.u, ring.k, ring.g, ring.write_pos, ring.origin, ring.is_flush,
          _c(q), _c(k), _c(v), _c(g, torch.float32), _c(beta, torch.float32), float(scale), int(bool(l2norm)), o,
          _c(slots, torch.int32), q.shape[0], T, gm.H, gm.HV, gm.K, gm.V, ring.ring_len, pc, _threads())
    done()


# ------------------------------------------------------------------------------------------------- tree

MAX_TREE_NODES = 32  # MAXN in tree_body.h: one uint32 ancestor bit set per node


def check_tree_sizes(ring) -> None:
    """The C tree kernels' stack limits, before any work: N nodes (bit sets) and the ring length."""
    if ring.window > MAX_TREE_NODES:
        raise ValueError(f"backend='cpu': tree N={ring.window} > {MAX_TREE_NODES} nodes (the C tree kernel keeps "
                         "one uint32 ancestor bit set per node)")
    check_cpu_sizes(ring_len=ring.ring_len)


def _check_tree_fits(ring, slots: torch.Tensor) -> None:
    """write_pos + N <= L on every live row (the early-flush rule): the kernel keeps h + N entries on its stack
    and writes the N nodes after the history, so a broken cursor is refused here, as the ref oracle does."""
    live = slots[slots != ring.null_slot].long()
    if live.numel() and int(ring.write_pos[live].max()) + ring.window > ring.max_len:
        raise ValueError(f"backend='cpu': a row has write_pos + N > L = {ring.max_len} (the ring would overflow; "
                         "tree_commit's early-flush rule keeps write_pos + N <= L)")


def mamba2_tree_replay(ring, x, dt, A, B, C, D, z, dt_bias, softplus, out, slots, parents) -> None:
    """ring: replayssm.mamba2.cache.SpecRing with window = N; node inputs [b, N, ...]; parents int32 [b, N].
    The N nodes' inputs go into the ring (and the folded checkpoint on is_flush rows); cursors are left to
    tree_commit."""
    _require_contiguous(state=ring.state, x=ring.x, B=ring.B, dt=ring.dt, bc=ring.bc, write_pos=ring.write_pos,
                        origin=ring.origin, is_flush=ring.is_flush)
    check_tree_sizes(ring)
    if ring.bc.shape[-1] != ring.window:
        raise ValueError(f"ring.bc holds {ring.bc.shape[-1]} window columns, the tree has N={ring.window} nodes")
    _check_tree_fits(ring, slots)
    g, N = ring.geometry, ring.window
    o, done = _out(out)
    _call(_fn("m2_tree_replay", ring.state.dtype, ring.x.dtype),
          ring.state, ring.x, ring.B, ring.dt, ring.bc, ring.write_pos, ring.origin, ring.is_flush,
          _c(parents, torch.int32), _c(x), _c(dt, torch.float32), _c(A, torch.float32), _c(B), _c(C),
          _c(D, torch.float32), _c(z), _c(dt_bias, torch.float32), int(bool(softplus)), o, _c(slots, torch.int32),
          x.shape[0], N, g.nheads, g.headdim, g.dstate, g.ngroups, ring.ring_len, _threads())
    done()


def gdn_tree_replay(ring, q, k, v, g, beta, scale: float, l2norm: bool, out, slots, parents) -> None:
    """ring: replayssm.gdn.ring.SpecRing or replayssm.kda.SpecRing with window = N; node inputs [b, N, ...];
    parents int32 [b, N]."""
    _require_contiguous(state=ring.state, u=ring.u, k=ring.k, g=ring.g, write_pos=ring.write_pos,
                        origin=ring.origin, is_flush=ring.is_flush)
    check_tree_sizes(ring)
    check_cpu_sizes(K=ring.geometry.K, V=ring.geometry.V)
    pc = _per_channel(g, ring.geometry.K, ring.g)
    _check_tree_fits(ring, slots)
    gm, N = ring.geometry, ring.window
    o, done = _out(out)
    _call(_fn("gdn_tree_replay", ring.state.dtype, ring.u.dtype),
          ring.state, ring.u, ring.k, ring.g, ring.write_pos, ring.origin, ring.is_flush, _c(parents, torch.int32),
          _c(q), _c(k), _c(v), _c(g, torch.float32), _c(beta, torch.float32), float(scale), int(bool(l2norm)), o,
          _c(slots, torch.int32), q.shape[0], N, gm.H, gm.HV, gm.K, gm.V, ring.ring_len, pc, _threads())
    done()
