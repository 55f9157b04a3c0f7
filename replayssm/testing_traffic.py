"""Interpreter traffic counter: the bytes every Triton launch loads and stores, per tensor argument.

Under TRITON_INTERPRET=1 every `tl.load` / `tl.store` of every program goes through two methods of the
interpreter's builder (`create_masked_load`, `create_masked_store`; the unmasked forms call them). While a
`TrafficCounter` is active both are wrapped: the addresses of the elements the mask keeps are collected,
and at the end of the launch they are attributed to the tensor argument whose storage holds them (CPU
tensors reach the interpreter without a copy, so kernel addresses are the tensors' own). Per launch and
tensor it records

    issued  bytes of every load/store executed, masked-off elements excluded (what the programs ask for)
    unique  bytes of distinct addresses (what HBM must deliver at least once if L2 catches the re-reads
            between programs: the roofline model of replayssm/traffic.py counts this)

A gap between the two on the state is a kernel that reads (or writes) the state twice within a launch, which
the model then has to count. No GPU counter is involved: this is what ties the byte model to the kernels on a
CPU. The suite (tests/replayssm/test_kernel_traffic.py) and scripts/kernels/kernel_traffic.py share this hook.

    with TrafficCounter() as counter:
        replay_step(cache, ..., backend="triton")
    counter.launches[0].kernel, counter.launches[0].tensors["state_ptr"].store_unique
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from replayssm.checks import interpreter_active


@dataclass
class TensorTraffic:
    """Bytes one launch moved from / to one tensor argument."""

    load_issued: int = 0
    load_unique: int = 0
    store_issued: int = 0
    store_unique: int = 0


@dataclass
class LaunchTraffic:
    """One kernel launch: its name, grid, phase (see TrafficCounter.mark) and the traffic of every tensor
    argument it touched, by parameter name (arguments sharing one storage are named together, "x_ptr|z_ptr";
    an address outside every argument's storage is filed under "?"). `addresses[(kind, name)]` holds the
    distinct element addresses behind the unique counts, and `elem[name]` their element size."""

    kernel: str
    grid: tuple[int, ...]
    phase: int = 0
    tensors: dict[str, TensorTraffic] = field(default_factory=dict)
    addresses: dict[tuple[str, str], np.ndarray] = field(default_factory=dict, repr=False)
    elem: dict[str, int] = field(default_factory=dict, repr=False)
    storage: dict[str, int] = field(default_factory=dict, repr=False)     # name -> storage base address

    def total(self, kind: str, exclude: tuple[str, ...] = ()) -> int:
        """Sum of field `kind` ("load_unique", "store_issued", ...) over the tensors not in `exclude`."""
        return sum(getattr(t, kind) for name, t in self.tensors.items() if name not in exclude)


class _Recorder:
    """Addresses touched by the launch in progress: (kind, addresses uint64 [n], element bytes)."""

    def __init__(self, kernel: str, args: dict[str, torch.Tensor]):
        self.kernel = kernel
        self.args = args
        self.accesses: list[tuple[str, np.ndarray, int]] = []

    def add(self, kind: str, ptrs, mask) -> None:
        data = np.asarray(ptrs.data)
        keep = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
        elem = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        self.accesses.append((kind, data[keep].astype(np.uint64).ravel(), elem))

    def finish(self, grid: tuple[int, ...], phase: int) -> LaunchTraffic:
        out = LaunchTraffic(self.kernel, grid, phase)
        by_storage: dict[tuple[int, int], list[str]] = {}
        for name, t in self.args.items():
            st = t.untyped_storage()
            by_storage.setdefault((st.data_ptr(), st.data_ptr() + st.nbytes()), []).append(name)
        ranges = sorted((lo, hi, "|".join(sorted(names))) for (lo, hi), names in by_storage.items())
        starts = np.array([r[0] for r in ranges], dtype=np.uint64)
        for kind in ("load", "store"):
            per_name: dict[str, list[np.ndarray]] = {}
            elem_of: dict[str, int] = {}
            for k, addrs, elem in self.accesses:
                if k != kind or addrs.size == 0:
                    continue
                idx = np.searchsorted(starts, addrs, side="right") - 1
                for i in np.unique(idx):
                    sel = addrs[idx == i]
                    name = "?"
                    if i >= 0 and int(sel.max()) < ranges[i][1]:
                        name = ranges[i][2]
                    per_name.setdefault(name, []).append(sel)
                    elem_of[name] = elem
            for name, chunks in per_name.items():
                addrs = np.concatenate(chunks)
                distinct = np.unique(addrs)
                t = out.tensors.setdefault(name, TensorTraffic())
                setattr(t, f"{kind}_issued", int(addrs.size) * elem_of[name])
                setattr(t, f"{kind}_unique", int(distinct.size) * elem_of[name])
                out.addresses[(kind, name)] = distinct
                out.elem[name] = elem_of[name]
                out.storage[name] = next((lo for lo, _, n in ranges if n == name), -1)
        return out


def phase_traffic(launches: list[LaunchTraffic]) -> dict[str, TensorTraffic]:
    """Traffic of launches issued back to back (one public call: a verify, a commit, an AR step), per tensor,
    as one unit: an address loaded by several launches, or stored by an earlier launch and loaded by a later
    one, is read from HBM once at most (the later launch finds it in L2). `*_unique` fields hold that; the
    `*_issued` fields the sum of the launches' own unique bytes (what separate phases would move). Tensors
    are matched across launches by storage, and named by every parameter name they had ("x_ptr|z_ptr")."""
    names: dict[int, set[str]] = {}
    acc: dict[int, TensorTraffic] = {}
    stored: dict[int, np.ndarray] = {}
    loaded: dict[int, np.ndarray] = {}
    empty = np.zeros(0, dtype=np.uint64)
    for launch in launches:
        for name, t in launch.tensors.items():
            key = launch.storage.get(name, -1)
            key = key if key >= 0 else hash(name)            # "?": unattributed addresses, by name
            names.setdefault(key, set()).update(name.split("|"))
            a = acc.setdefault(key, TensorTraffic())
            a.load_issued += t.load_unique
            a.store_issued += t.store_unique
            elem = launch.elem[name]
            new = launch.addresses.get(("load", name), empty)
            fresh = np.setdiff1d(np.setdiff1d(new, loaded.get(key, empty), assume_unique=True),
                                 stored.get(key, empty), assume_unique=True)
            a.load_unique += int(fresh.size) * elem
            loaded[key] = np.union1d(loaded.get(key, empty), new)
            wrote = launch.addresses.get(("store", name), empty)
            a.store_unique += int(np.setdiff1d(wrote, stored.get(key, empty), assume_unique=True).size) * elem
            stored[key] = np.union1d(stored.get(key, empty), wrote)
    return {"|".join(sorted(names[key])): t for key, t in acc.items()}


class TrafficCounter(contextlib.AbstractContextManager):
    """Counts every interpreted launch inside the `with` block into `launches` (in launch order)."""

    def __init__(self):
        self.launches: list[LaunchTraffic] = []
        self.phase = 0
        self._stack: contextlib.ExitStack | None = None

    def mark(self) -> None:
        """Start a new phase: launches after this are not back to back with those before (a verify and its
        commit are separated by the acceptance step and the other layers' work)."""
        self.phase += 1

    def __enter__(self) -> TrafficCounter:
        if not interpreter_active():
            raise RuntimeError("TrafficCounter needs the Triton interpreter: set TRITON_INTERPRET=1 before "
                               "importing triton")
        from triton.runtime import interpreter

        builder_cls, executor_cls = interpreter.InterpreterBuilder, interpreter.GridExecutor
        original_load, original_store = builder_cls.create_masked_load, builder_cls.create_masked_store
        original_call = executor_cls.__call__
        counter, current = self, []         # current: the _Recorder of the launch in progress

        def masked_load(builder, ptrs, mask, *args, **kwargs):
            if current:
                current[-1].add("load", ptrs, mask)
            return original_load(builder, ptrs, mask, *args, **kwargs)

        def masked_store(builder, ptrs, value, mask, *args, **kwargs):
            if current:
                current[-1].add("store", ptrs, mask)
            return original_store(builder, ptrs, value, mask, *args, **kwargs)

        def call(executor, *args_dev, **kwargs):
            params = list(inspect.signature(executor.fn).parameters)
            named = dict(zip(params, args_dev)) | {k: v for k, v in kwargs.items() if k in params}
            tensors = {k: v for k, v in named.items() if isinstance(v, torch.Tensor)}
            current.append(_Recorder(executor.fn.__name__, tensors))
            try:
                result = original_call(executor, *args_dev, **kwargs)
            finally:
                rec = current.pop()
            grid = executor.grid(named) if callable(executor.grid) else executor.grid
            counter.launches.append(rec.finish(tuple(int(g) for g in grid), counter.phase))
            return result

        self._stack = contextlib.ExitStack()
        for cls, name, new, old in ((builder_cls, "create_masked_load", masked_load, original_load),
                                    (builder_cls, "create_masked_store", masked_store, original_store),
                                    (executor_cls, "__call__", call, original_call)):
            setattr(cls, name, new)
            self._stack.callback(setattr, cls, name, old)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        self._stack = None

    def by_kernel(self, kernel: str) -> list[LaunchTraffic]:
        return [launch for launch in self.launches if launch.kernel == kernel]

    def tensor(self, name: str, kind: str, kernel: str | None = None) -> int:
        """Field `kind` of tensor argument `name`, summed over the launches (of `kernel`, if given)."""
        return sum(getattr(launch.tensors[name], kind) for launch in self.launches
                   if name in launch.tensors and (kernel is None or launch.kernel == kernel))

    def total(self, kind: str, exclude: tuple[str, ...] = ()) -> int:
        return sum(launch.total(kind, exclude) for launch in self.launches)

    def clear(self) -> None:
        self.launches.clear()
        self.phase = 0

    def phases(self) -> list[dict[str, TensorTraffic]]:
        """`phase_traffic` of each phase, in order."""
        return [phase_traffic([lch for lch in self.launches if lch.phase == p])
                for p in sorted({lch.phase for lch in self.launches})]


@contextlib.contextmanager
def counting() -> Iterator[TrafficCounter]:
    """`with counting() as c:` — a TrafficCounter as a generator context (for pytest fixtures)."""
    with TrafficCounter() as counter:
        yield counter
