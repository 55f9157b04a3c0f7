"""A kernel's SASS as instructions, a control-flow graph and the instruction count on its executed paths.

Input: `cuobjdump --dump-sass` of one cubin (one function), and optionally the kernel's TTGIR for loop trip counts.

- `instruction_mix`: static counts of the whole function: total, SHFL, BAR (BAR.SYNC / BAR.ARV / BAR.RED:
  block-wide barriers; the BSSY / BSYNC convergence barriers are not counted), LDS / LDSM, STS, MMA (HMMA,
  HGMMA, and sm_100's UTC*MMA), MUFU (exp, rsqrt, ...), LDG / STG. The padding after the last EXIT (the trap loop
  `BRA` to itself and the NOPs that align the function) is not an instruction the kernel runs, so it is left out.
- `paths`: instructions one warp issues from the entry to an EXIT, on the shortest path that stores to global
  memory (`path_min`: a program that returns early, e.g. for a padded row, writes nothing and is not a step's
  work) and on the longest path (`path_max`). A conditional `@P BRA` has both successors; `@P EXIT` may end the
  path or fall through. A predicated instruction is counted whatever its predicate: the warp issues it (ncu's
  warp-level "instructions issued" counts it too).
- Loops: a backward branch (target at or before the branch) closes a loop whose body is every block between
  its target and the branch (ptxas lays Triton's structured loops out contiguously). A block's instructions
  count once per iteration of every loop around it, so a path through a loop costs trips x its body. Trip
  counts come from the TTGIR (`ttgir_loop_trips`): each `scf.for` whose bounds and step are constants, in text
  order, matched to the SASS loops in address order when both have the same number of loops. Otherwise (a
  runtime bound, a loop LLVM unrolled, a count mismatch) a loop counts once and `loops_unknown` says how many.

Limits: the executed path is data-dependent and these are its two ends (for the replay AR step, min is the
normal step and max the flush, which is why the cycle mean weights them (L-1):1); both ends assume every
iteration of a loop takes the same branches; subroutine calls (CALL.REL, the IEEE div / sqrt slow paths) count
as one instruction; an indirect branch (BRX / JMX) is not followed and is flagged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_]+(?:\.[A-Za-z0-9_]+)*)([^;]*);")
_TARGET = re.compile(r"0x([0-9a-f]+)")
_OPERAND_PRED = re.compile(r"^\s*(!?U?P(?:[0-6]|T))\s*,")       # sm_100's `BRA.U !UP2, 0x3950`: a predicate operand
MIX_CLASSES = {                          # column -> opcode prefixes (the first dot-separated token)
    "shfl": ("SHFL",),
    "bar": ("BAR",),
    "lds": ("LDS", "LDSM"),
    "sts": ("STS",),
    "mma": ("HMMA", "HGMMA", "UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA", "IMMA", "QMMA", "OMMA", "DMMA"),
    "mufu": ("MUFU",),
    "ldg": ("LDG", "LDGSTS"),
    "stg": ("STG",),
}
GLOBAL_WRITES = ("STG", "RED", "ATOM", "ATOMG", "UBLKCP", "UTMASTG", "SUST")


@dataclass(frozen=True)
class Instr:
    addr: int
    pred: str            # "" or e.g. "@!P0"
    op: str              # opcode with modifiers, e.g. "LDG.E.128"
    target: int | None   # branch target address (BRA, BRA.U, ...)

    @property
    def base(self) -> str:
        return self.op.split(".")[0]


def parse_sass(text: str) -> list[Instr]:
    """The instructions of a one-function SASS listing (cuobjdump --dump-sass or nvdisasm), padding removed."""
    out = []
    for m in _LINE.finditer(text):
        addr, pred, op, rest = int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4)
        target = None
        if op.split(".")[0] in ("BRA", "CALL", "BRX", "JMP", "JMX"):
            t = _TARGET.search(rest)
            target = int(t.group(1), 16) if t else None
            p = _OPERAND_PRED.match(rest)
            if p and p.group(1) not in ("PT", "UPT") and not pred:
                pred = f"@{p.group(1)}"             # conditional on its operand: both successors
        out.append(Instr(addr, pred, op, target))
    last_exit = max((i for i, x in enumerate(out) if x.base == "EXIT" and not x.pred), default=len(out) - 1)
    tail = out[last_exit + 1:]
    # ptxas ends a function with a branch to itself and NOPs up to its alignment: not executed
    if all(x.base == "NOP" or (x.base == "BRA" and x.target == x.addr) for x in tail):
        out = out[:last_exit + 1]
    return out


def instruction_mix(instrs: list[Instr]) -> dict[str, int]:
    """{"total": n, "shfl": n, "bar": n, "lds": n, "sts": n, "mma": n, "mufu": n, "ldg": n, "stg": n}."""
    mix = {"total": len(instrs), **{k: 0 for k in MIX_CLASSES}}
    for x in instrs:
        for k, prefixes in MIX_CLASSES.items():
            if x.base in prefixes:
                mix[k] += 1
    return mix


_FOR = re.compile(r"scf\.for\s+%[\w.#:]+\s*=\s*(%[\w.#]+)\s+to\s+(%[\w.#]+)\s+step\s+(%[\w.#]+)")
_WHILE = re.compile(r"\bscf\.while\b")
_CONST = re.compile(r"(%[\w.#]+)\s*=\s*arith\.constant\s+(-?\d+)\s*:\s*i(?:32|64)\b")


def ttgir_loop_trips(ttgir: str) -> list[int | None]:
    """Trip count of every loop of a TTGIR module in text order: (ub - lb + step - 1) // step for an `scf.for`
    whose bounds and step are integer constants, None for a runtime bound or an `scf.while`."""
    consts = {m.group(1): int(m.group(2)) for m in _CONST.finditer(ttgir)}
    loops: list[tuple[int, int | None]] = []
    for m in _FOR.finditer(ttgir):
        lb, ub, step = (consts.get(g) for g in m.groups())
        trips = None if None in (lb, ub, step) or step <= 0 else max(0, (ub - lb + step - 1) // step)
        loops.append((m.start(), trips))
    loops += [(m.start(), None) for m in _WHILE.finditer(ttgir)]
    return [t for _, t in sorted(loops)]


@dataclass
class Paths:
    """Instructions per warp on the shortest storing path and the longest path, with the loops found."""

    path_min: int
    path_max: int
    loops: int
    loops_unknown: int        # loops counted once: no trip count for them
    trips: tuple[int | None, ...]   # each loop's trip count in address order (None: unknown, counted once)
    note: str = ""


def _blocks(instrs: list[Instr]) -> tuple[list[tuple[int, int]], dict[int, int]]:
    """[(first, last + 1) instruction indices] of the basic blocks, and {address: instruction index}."""
    index = {x.addr: i for i, x in enumerate(instrs)}
    leaders = {0}
    for i, x in enumerate(instrs):
        if x.base in ("BRA", "EXIT", "BRX", "JMX", "RET") or (x.base == "JMP"):
            leaders.add(i + 1)
        if x.base in ("BRA", "JMP") and x.target in index:
            leaders.add(index[x.target])
    starts = sorted(s for s in leaders if s < len(instrs))
    return [(s, e) for s, e in zip(starts, starts[1:] + [len(instrs)])], index


def paths(instrs: list[Instr], trips: list[int | None] | None = None) -> Paths:
    """Path lengths of one kernel (see the module docstring); `trips`: ttgir_loop_trips of the same kernel."""
    if not instrs:
        return Paths(0, 0, 0, 0, ())
    blocks, index = _blocks(instrs)
    block_of = {s: b for b, (s, _) in enumerate(blocks)}
    succ: list[list[int]] = []
    ends: list[bool] = []                 # the block may end the program here
    back: list[tuple[int, int]] = []      # (latch block, header block)
    note = []
    for b, (_, e) in enumerate(blocks):
        last, nxt = instrs[e - 1], [b + 1] if b + 1 < len(blocks) else []
        out, end = nxt, False
        if last.base == "EXIT":
            out, end = (nxt if last.pred else []), True
        elif last.base in ("BRA", "JMP"):
            tgt = block_of.get(index.get(last.target, -1))
            if tgt is None:
                note.append(f"branch at {last.addr:#x} to an unknown target")
            taken = [] if tgt is None else [tgt]
            if tgt is not None and tgt <= b:
                back.append((b, tgt))
                taken = []                    # a loop's back edge: its iterations are counted by weight
            out = (taken + nxt) if last.pred else taken
        elif last.base in ("BRX", "JMX", "RET"):
            note.append(f"{last.base} at {last.addr:#x} not followed")
            out, end = [], True
        succ.append(out)
        ends.append(end)
    back.sort(key=lambda lh: (lh[1], -lh[0]))
    loop_trips = _match_trips(len(back), trips)
    weight = [1] * len(blocks)
    for (latch, header), t in zip(back, loop_trips):
        for b in range(header, latch + 1):
            weight[b] *= max(t or 1, 1)
        # a branch around a loop that runs (its trip count known, >= 1) is not a path a program takes
        if t and header > 0:
            succ[header - 1] = [c for c in succ[header - 1] if c != latch + 1] or succ[header - 1]
    cost = [(e - s) * w for (s, e), w in zip(blocks, weight)]
    stores = [any(instrs[i].base in GLOBAL_WRITES for i in range(s, e)) for s, e in blocks]
    lo, hi = _extremes(succ, ends, cost, stores)
    unknown = sum(1 for t in loop_trips if t is None)
    if trips is not None and len(trips) != len(back):
        note.append(f"{len(back)} loops in the SASS, {len(trips)} in the TTGIR: trip counts not applied")
    return Paths(lo, hi, len(back), unknown, tuple(loop_trips), "; ".join(note))


def _match_trips(n_loops: int, trips: list[int | None] | None) -> list[int | None]:
    if trips is None or len(trips) != n_loops:
        return [None] * n_loops
    return list(trips)


def _extremes(succ: list[list[int]], ends: list[bool], cost: list[int], stores: list[bool]) -> tuple[int, int]:
    """(shortest entry-to-end path through at least one storing block, longest entry-to-end path) of a DAG whose
    edges all go forward (back edges removed); block order is a topological order."""
    INF = float("inf")
    n = len(cost)
    # best[b][s]: (min, max) cost of a path from the entry to the end of block b, s = a store seen on it
    lo = [[INF, INF] for _ in range(n)]
    hi = [[-INF, -INF] for _ in range(n)]
    lo[0][stores[0]] = hi[0][stores[0]] = cost[0]
    end_lo, end_hi = INF, -INF
    for b in range(n):
        for s in (0, 1):
            if lo[b][s] == INF:
                continue
            if ends[b]:
                end_hi = max(end_hi, hi[b][s])
                if s:
                    end_lo = min(end_lo, lo[b][s])
            for c in succ[b]:
                t = int(s or stores[c])
                lo[c][t] = min(lo[c][t], lo[b][s] + cost[c])
                hi[c][t] = max(hi[c][t], hi[b][s] + cost[c])
    if end_lo == INF:                     # nothing stores (or no path ends): the longest path is all we have
        end_lo = end_hi
    return int(end_lo if end_lo != INF else 0), int(end_hi if end_hi != -INF else 0)
