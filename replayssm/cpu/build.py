"""Build and load the fused CPU kernels (kernels.c + kernels_body.h) once per machine, cached on disk.

The toolchain is the system C compiler with OpenMP, called directly and loaded with ctypes: a build of every
kernel takes seconds where a torch C++ extension compiles the torch headers for minutes, and it needs nothing
beyond a compiler, offline (the measurements: replayssm/cpu/README.md). One shared library holds every
kernel for every (state dtype, activation dtype) pair; kernel shapes are runtime arguments, so nothing is
rebuilt per batch, geometry or dtype. The library is cached under

    $REPLAYSSM_CPU_CACHE  (default: $XDG_CACHE_HOME/replayssm/cpu-kernels, else ~/.cache/replayssm/cpu-kernels)

in a directory named by a hash of the sources, the compiler's version, the flags and this CPU's model and
feature flags (the build uses -march=native), so a changed source, compiler or machine builds afresh and
concurrent processes (pytest-xdist workers) take a file lock and build it once.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("kernels.c", "kernels_body.h", "sr_body.h", "spec_body.h", "gdn_spec_body.h", "tree_body.h")
# (C storage type, load / store macro suffix, stochastic-rounding format: kernels.c's SR_F16 / SR_BF16) per dtype
STORAGE = {"f32": ("float", "F32", "0"), "f16": ("f16_t", "F16", "SR_F16"), "bf16": ("uint16_t", "BF16", "SR_BF16")}
# Reassociation lets gcc vectorise the dot-product reductions (sums in another order, within fp32 rounding);
# no -ffinite-math-only: NaN inputs and poisoned outputs must stay NaN.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno", "-fassociative-math",
         "-fno-signed-zeros", "-fno-trapping-math")


ABI = 2     # kernels.c's replayssm_cpu_abi(): 2 = the AR kernels take the stochastic-rounding counter and seed


class CpuKernelsUnavailable(RuntimeError):
    """No C compiler with OpenMP here, or the build failed: backend='cpu' cannot run."""


def cache_root() -> Path:
    env = os.environ.get("REPLAYSSM_CPU_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "replayssm" / "cpu-kernels"


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise CpuKernelsUnavailable("backend='cpu' needs a C compiler with OpenMP (cc/gcc/clang on PATH, or $CC)")
    return cc


def _cpu_fingerprint() -> str:
    flags = model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not model and line.startswith("model name"):
                model = line
            if not flags and line.startswith(("flags", "Features")):
                flags = line
    except OSError:
        pass
    return f"{platform.machine()}|{model}|{flags}"


def generated_source() -> str:
    """kernels.c plus one instantiation of kernels_body.h per (state, act) storage pair; the fp16 ones are
    guarded by HAVE_F16 (no _Float16 in the compiler: they are left out and has_fp16() says so). SR_FMT: the
    stochastic-rounding rule of the state storage (0 for fp32: no SR store is compiled in)."""
    parts = ['#include "kernels.c"']
    for s, (st, sm, sr) in STORAGE.items():
        for a, (at, am, _) in STORAGE.items():
            guard = "f16" in (s, a)
            parts += (["#if HAVE_F16"] if guard else []) + [
                f"#define STYPE {st}", f"#define LDS LD_{sm}", f"#define STS ST_{sm}", f"#define LDS8 LD8_{sm}",
                f"#define STS8 ST8_{sm}", f"#define SR_FMT {sr}", f"#define ATYPE {at}", f"#define LDA LD_{am}",
                f"#define STA ST_{am}", f"#define SUF(n) n##_{s}_{a}", '#include "kernels_body.h"',
                *(f"#undef {m}" for m in ("STYPE", "LDS", "STS", "LDS8", "STS8", "SR_FMT", "ATYPE", "LDA", "STA",
                                          "SUF")),
            ] + (["#endif"] if guard else [])
    return "\n".join(parts) + "\n"


def _key(cc: str) -> str:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((HERE / name).read_bytes())
    for part in (generated_source(), version, " ".join(FLAGS), _cpu_fingerprint()):
        h.update(part.encode())
    return h.hexdigest()[:16]


def build(force: bool = False) -> Path:
    """Path of the shared library, compiling it first if this machine's cache lacks it (a few seconds)."""
    cc = compiler()
    target_dir = cache_root() / _key(cc)
    lib = target_dir / "libreplayssm_cpu.so"
    if lib.exists() and not force:
        return lib
    target_dir.mkdir(parents=True, exist_ok=True)
    with open(target_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # one builder; the others wait, then find the library
        if lib.exists() and not force:
            return lib
        with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
            src = Path(tmp) / "all_kernels.c"
            src.write_text(generated_source())
            out = Path(tmp) / lib.name
            cmd = [cc, *FLAGS, f"-I{HERE}", str(src), "-o", str(out), "-lm"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CpuKernelsUnavailable(f"building the CPU kernels failed ({' '.join(cmd)}):\n"
                                            f"{proc.stderr[-4000:]}")
            os.replace(out, lib)                    # atomic: a reader never sees a half-written library
    return lib


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    if lib.replayssm_cpu_abi() != ABI:
        raise CpuKernelsUnavailable("stale CPU kernel library (ABI mismatch): delete the cache directory "
                                    f"{cache_root()}")
    return lib


def has_fp16() -> bool:
    return bool(library().replayssm_cpu_has_fp16())
