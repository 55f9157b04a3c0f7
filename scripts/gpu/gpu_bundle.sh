#!/usr/bin/env bash
# scripts/gpu/gpu_bundle.sh DIR [--full]: the wheels a GPU box without a package registry needs, for its Python.
#
# Run here (this box reaches PyPI); copy DIR to the GPU box; `WHEELS=DIR bash scripts/gpu/gpu_check.sh OUT`
# installs exactly the files of DIR/MANIFEST.tsv there, offline, after checking each one's sha256 and size.
#
#   default  what the GPU box lacks (it has torch 2.11 / triton 3.6, pandas, matplotlib, numpy, pytest,
#            pytest-benchmark, pytest-xdist, nvidia-ml-py, tqdm, pyyaml, einops): hydra-core, omegaconf,
#            the antlr4 runtime omegaconf 2.3 needs, hydra-submitit-launcher and submitit, hydra-joblib-launcher
#            and joblib (GPUS=N), with their deps; and the peers whose rows run beside ours: fla-core (pure
#            Python) and mamba_ssm, built here without its CUDA extension (its Triton ops are what the peer
#            rows call; MAMBA_SKIP_CUDA_BUILD), as a pure-Python wheel
#   --full   every harness dependency beyond torch / triton (pyproject.toml + the test extra), for a box
#            that has nothing but torch
# Versions are the pins of constraints-cpu.txt (the stack the suite is tested with) where it pins them.
# Binary wheels are cp312 manylinux x86_64 (GPU_PYTHON, GPU_PLATFORMS override); antlr4-python3-runtime
# 4.9.3 exists only as an sdist, so its (pure Python) wheel is built here with `pip wheel`.
# DIR/MANIFEST.tsv: name, version, sha256, size, file of every wheel; the script fails if DIR ends up
# larger than BUNDLE_LIMIT_MIB (default 64).
# The box's torch / Triton pair: the bundle is made for the pair make test-gpu-stack tests (torch 2.11.0+cu130
# with triton 3.6.0: the `# gpu-box:` line of constraints-gpustack.txt), written into MANIFEST.tsv as a
# `# box-stack:` line that gpu_check.sh's wheels stage compares with the box's. BOX_STACK="torch==X triton==Y"
# (what the box prints for `python -c 'import torch, triton; print(torch.__version__, triton.__version__)'`)
# checks it here first; a box with another pair is said loudly, and the bundle is still made.
#
# Environment: PY (python whose pip runs; default .venv/bin/python, else python3), GPU_PYTHON (3.12),
# GPU_PLATFORMS ("manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64"), BUNDLE_LIMIT_MIB (64),
# BOX_STACK (the box's pair, to check), TESTED_STACK (the pair to expect; default from constraints-gpustack.txt).
set -euo pipefail

usage() { echo "usage: bash scripts/gpu/gpu_bundle.sh DIR [--full]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
MODE=missing
if [[ $# -eq 2 ]]; then
    [[ "$2" == "--full" ]] || usage
    MODE=full
fi
cd "$(dirname "$0")/../.."
REPO="$PWD"
mkdir -p "$1"
DIR="$(cd "$1" && pwd)"
if [[ -z "${PY:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
GPU_PYTHON="${GPU_PYTHON:-3.12}"
ABI="cp${GPU_PYTHON/./}"
read -r -a PLATFORMS <<< "${GPU_PLATFORMS:-manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64}"
LIMIT_MIB="${BUNDLE_LIMIT_MIB:-64}"
TESTED_STACK="${TESTED_STACK:-$(sed -n 's/^# gpu-box: *//p' constraints-gpustack.txt 2>/dev/null | head -n 1)}"
[[ -n "$TESTED_STACK" ]] || { echo "gpu_bundle: no '# gpu-box:' line in constraints-gpustack.txt" >&2; exit 2; }
export TESTED_STACK

# the box's torch/Triton pair against the tested one (versions compared as written, `==`-separated pairs)
check_box_stack() {
    local want have
    want="$(tr ' ' '\n' <<< "$TESTED_STACK" | grep -E '^(torch|triton)==' | sort | tr '\n' ' ')"
    have="$(tr ' ' '\n' <<< "$1" | grep -E '^(torch|triton)==' | sort | tr '\n' ' ')"
    if [[ "$want" == "$have" ]]; then
        echo "gpu_bundle: the box's pair ${have% } is the one tested here (make test-gpu-stack)"
    else
        echo "gpu_bundle: WARNING: NOT THE TESTED PAIR: the box has '${1}', make test-gpu-stack tests" \
            "'${TESTED_STACK}'. The default set leaves torch / triton to the box: its kernels were built and" \
            "tested here only with the tested pair (and triton 3.7.1)." >&2
    fi
}

MISSING_PKGS=(hydra-core omegaconf antlr4-python3-runtime hydra-submitit-launcher submitit hydra-joblib-launcher
              joblib fla-core==0.6.0)
MAMBA=mamba-ssm==2.3.2.post1      # built below (no binary wheel without CUDA extensions on PyPI)
FULL_PKGS=("${MISSING_PKGS[@]}" numpy pandas matplotlib tqdm nvidia-ml-py pyyaml pytest pytest-benchmark
           pytest-xdist einops)
if [[ "$MODE" == full ]]; then PKGS=("${FULL_PKGS[@]}"); else PKGS=("${MISSING_PKGS[@]}"); fi

# name==version from constraints-cpu.txt where it pins the package (case and -/_ insensitive)
pinned() {
    local want line
    want="$(tr 'A-Z_' 'a-z-' <<< "$1")"
    line="$(grep -iE "^${want//-/[-_]}==" "$REPO/constraints-cpu.txt" | head -n 1 || true)"
    if [[ -n "$line" ]]; then echo "$line"; else echo "$1"; fi
}

REQS=()
for pkg in "${PKGS[@]}"; do
    [[ "$pkg" == antlr4-python3-runtime ]] && continue
    REQS+=("$(pinned "$pkg")")
done

echo "gpu_bundle: $MODE set for CPython $GPU_PYTHON ($ABI, ${PLATFORMS[*]}) -> $DIR"
echo "gpu_bundle: for a box with $TESTED_STACK (the pair make test-gpu-stack tests)"
if [[ -n "${BOX_STACK:-}" ]]; then
    check_box_stack "$BOX_STACK"
else
    echo "gpu_bundle: BOX_STACK unset: the box's pair is checked there (gpu_check.sh: env and wheels stages)"
fi
# 1. antlr4: sdist only on PyPI; a pure-Python wheel built here serves every Python 3. mamba_ssm: its sdist,
#    built here without the CUDA extension (needs this venv's torch: --no-build-isolation) -> a py3-none-any
#    wheel of its Python sources, which imports on any CPython 3 with torch + triton (the box has both).
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$DIR" antlr4-python3-runtime==4.9.3
MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \
    "$PY" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$DIR" "$MAMBA"
ls "$DIR"/mamba_ssm-*-py3-none-any.whl >/dev/null \
    || { echo "gpu_bundle: the mamba_ssm wheel is not pure Python (did a CUDA extension build?)" >&2; exit 1; }
# 2. everything else as binary wheels for the GPU box's interpreter; deps resolved for that target. The
#    antlr4 wheel of step 1 satisfies omegaconf's requirement (--find-links DIR).
PLATFORM_ARGS=()
for plat in "${PLATFORMS[@]}"; do PLATFORM_ARGS+=(--platform "$plat"); done
EXCLUDE=()
if [[ "$MODE" == missing ]]; then
    # already on the GPU box: never shadow its copies with ours
    EXCLUDE=(torch triton numpy pandas matplotlib pytest pyyaml packaging typing-extensions filelock einops)
fi
"$PY" -m pip download --quiet --dest "$DIR" --find-links "$DIR" --only-binary=:all: \
    --python-version "$GPU_PYTHON" --implementation cp --abi "$ABI" "${PLATFORM_ARGS[@]}" "${REQS[@]}"

"$PY" - "$DIR" "$LIMIT_MIB" "$MODE" "${EXCLUDE[@]+"${EXCLUDE[@]}"}" <<'PYEOF'
"""Drop excluded packages, write MANIFEST.tsv, enforce the size limit."""
import hashlib
import os
import re
import sys
from pathlib import Path

out, limit_mib, mode, exclude = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
drop = {norm(x) for x in exclude}
rows, total = [], 0
for whl in sorted(out.glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    if norm(name) in drop:
        whl.unlink()
        print(f"  dropped {whl.name} (the GPU box has {name})")
        continue
    data = whl.read_bytes()
    rows.append((norm(name), version, hashlib.sha256(data).hexdigest(), len(data), whl.name))
    total += len(data)
leftovers = [p.name for p in out.iterdir() if p.is_file() and p.suffix != ".whl" and p.name != "MANIFEST.tsv"]
if leftovers:
    sys.exit(f"gpu_bundle: not wheels (an sdist slipped in?): {leftovers}")
with open(out / "MANIFEST.tsv", "w") as f:
    f.write(f"# gpu_bundle {mode} set: {len(rows)} wheels, {total} bytes ({total / 2**20:.2f} MiB)\n")
    f.write(f"# box-stack: {os.environ['TESTED_STACK']}\n")
    f.write("name\tversion\tsha256\tsize\tfile\n")
    for r in rows:
        f.write("\t".join(map(str, r)) + "\n")
for r in rows:
    print(f"  {r[0]:<28} {r[1]:<12} {r[3] / 2**20:7.2f} MiB  {r[4]}")
print(f"gpu_bundle: {len(rows)} wheels, {total / 2**20:.2f} MiB -> {out / 'MANIFEST.tsv'}")
if total > limit_mib * 2**20:
    sys.exit(f"gpu_bundle: {total / 2**20:.2f} MiB exceeds the {limit_mib:g} MiB limit")
PYEOF
