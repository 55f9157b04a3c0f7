"""The env and wheels stages' programs (run by the runner; formerly heredocs in gpu_check.sh).

    python -m experiments.gpu_check.provenance env ENV_JSON
    python -m experiments.gpu_check.provenance wheels BUNDLE SITE [--dry]

env: Python, platform, torch / CUDA, the GPU's properties and a measured 1 GiB device copy bandwidth, NVML
(driver, clocks), the harness's modules and their versions, the commit the tree says it is, and whether torch /
triton are the pair `make test-gpu-stack` tests (TESTED_STACK, constraints-gpustack.txt's `# gpu-box:` line):
said clearly when they are not, never a failure. First contact reads no launch table: env.json says which.

wheels: every file of BUNDLE/MANIFEST.tsv (scripts/gpu/gpu_bundle.sh) is checked (sha256, size, a tag this
Python installs; --dry: a cp312 binary for the GPU box is only checked), installed offline into SITE, then
every module the harness imports is imported from SITE first (a second process, SITE on its path): a gap
fails the stage naming `gpu_bundle.sh DIR --full`. The pair the bundle was made for (MANIFEST.tsv's
`# box-stack:` line) is compared with this box's.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("triton", "hydra", "omegaconf", "pandas", "numpy", "matplotlib", "tqdm", "pynvml", "pytest",
           "pytest_benchmark", "xdist", "einops", "mamba_ssm", "fla", "flashinfer")
NEEDED = ["torch", "triton", "numpy", "pandas", "matplotlib", "yaml", "tqdm", "pynvml", "packaging", "einops",
          "hydra", "omegaconf", "antlr4", "pytest", "pytest_benchmark",
          "experiments.kernel.run", "experiments.hybrid.run", "experiments.accuracy", "replayssm.traffic",
          "experiments.report.claims", "experiments.report.figures.plots"]


def _pair(d: dict) -> str:
    return f"torch {d.get('torch')} with triton {d.get('triton')}"


def git_state() -> dict:
    """The commit of the tree that runs, as its git metadata says (a box's copy can carry stale metadata:
    results/h200's READMEs name the commit the session sent)."""
    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    commit = git("rev-parse", "HEAD")
    return {"git_commit": commit or "unknown (no git metadata)",
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None}


def env_info() -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform(),
            "launch_tables": f"REPLAYSSM_LAUNCH_TABLES={os.environ.get('REPLAYSSM_LAUNCH_TABLES')}"
                             + (": every kernel at its default launch config (rows: launch_source=default)"
                                if os.environ.get("REPLAYSSM_LAUNCH_TABLES") == "off" else ""),
            "git": git_state()}
    try:
        import torch
        info.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(gpu_name=p.name, compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                        gpu_memory_bytes=p.total_memory, l2_bytes=getattr(p, "L2_cache_size", None))
            from experiments.harness.timing import measure_copy_GBps
            info["copy_GBps"] = measure_copy_GBps("cuda", 1 << 30)     # 1 GiB copy, read + write counted
    except Exception as exc:  # noqa: BLE001 - report whatever is broken
        info["torch_error"] = repr(exc)
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        clock = pynvml.nvmlDeviceGetMaxClockInfo
        info["nvml"] = {"driver": pynvml.nvmlSystemGetDriverVersion(), "name": pynvml.nvmlDeviceGetName(h),
                        "memory_total": pynvml.nvmlDeviceGetMemoryInfo(h).total,
                        "max_sm_clock_mhz": clock(h, pynvml.NVML_CLOCK_SM),
                        "max_mem_clock_mhz": clock(h, pynvml.NVML_CLOCK_MEM)}
    except Exception as exc:  # noqa: BLE001
        info["nvml"] = f"unavailable: {type(exc).__name__}: {exc}"
    modules = {}
    for name in MODULES:
        try:
            modules[name] = getattr(importlib.import_module(name), "__version__", "present")
        except Exception as exc:  # noqa: BLE001
            modules[name] = f"absent: {type(exc).__name__}"
    info["modules"] = modules
    tested = dict(x.split("==", 1) for x in os.environ.get("TESTED_STACK", "").split() if "==" in x)
    box = {"torch": info.get("torch", "absent"), "triton": modules.get("triton")}
    match = bool(tested) and all(box.get(k) == v for k, v in tested.items())
    info["stack"] = {"tested_pair": _pair(tested), "box_pair": _pair(box), "match": match}
    info["stack_note"] = (f"{_pair(box)}: the pair tested here (make test-gpu-stack)" if match else
                          f"NOT THE TESTED PAIR: this box has {_pair(box)}; make test-gpu-stack tests "
                          f"{_pair(tested)} (constraints-gpustack.txt). Kernels may build or run differently: results "
                          "are still recorded")
    return info


def env_stage(path: Path) -> int:
    info = env_info()
    path.write_text(json.dumps(info, indent=2, default=str))
    print(json.dumps(info, indent=2, default=str))
    print(f"stack: {info['stack_note']}")
    return 0


def _packaging():
    try:
        from packaging.tags import sys_tags
        from packaging.utils import parse_wheel_filename
    except ImportError:                       # pip vendors packaging
        from pip._vendor.packaging.tags import sys_tags
        from pip._vendor.packaging.utils import parse_wheel_filename
    return sys_tags, parse_wheel_filename


def install(bundle: Path, site: Path, dry: bool) -> str | None:
    """Check the manifest and install the wheels this Python can into `site`; an error message or None."""
    sys_tags, parse_wheel_filename = _packaging()
    manifest = bundle / "MANIFEST.tsv"
    if not manifest.is_file():
        return f"{manifest} not found (make the bundle with scripts/gpu/gpu_bundle.sh DIR)"
    lines = [ln for ln in manifest.read_text().splitlines() if ln and not ln.startswith("#")]
    header = lines[0].split("\t")
    if header[:5] != ["name", "version", "sha256", "size", "file"]:
        return f"unexpected manifest header {header}"
    rows = [dict(zip(header, ln.split("\t"))) for ln in lines[1:]]
    here, todo, checked, bad = set(sys_tags()), [], [], []
    extra = sorted(p.name for p in bundle.glob("*.whl") if p.name not in {r["file"] for r in rows})
    if extra:
        bad.append(f"wheels in {bundle} but not in the manifest: {extra}")
    for r in rows:
        path = bundle / r["file"]
        if not path.is_file():
            bad.append(f"{r['file']}: missing")
            continue
        data = path.read_bytes()
        if len(data) != int(r["size"]) or hashlib.sha256(data).hexdigest() != r["sha256"]:
            bad.append(f"{r['file']}: size/sha256 differ from the manifest")
            continue
        tags = parse_wheel_filename(r["file"])[3]
        if tags & here:
            todo.append(path)
        elif dry and all(t.interpreter == "cp312" and "x86_64" in t.platform for t in tags):
            checked.append(r["file"])          # for the GPU box's CPython 3.12: hash and tag checked only
        else:
            bad.append(f"{r['file']}: no tag this Python can install ({sorted(map(str, tags))[:2]} ...)")
    if bad:
        return "; ".join(bad)
    print(f"wheels: {len(rows)} manifest entries verified (sha256, size)")
    for name in checked:
        print(f"  checked only (cp312 binary, not installable on this Python): {name}")
    if todo:
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
               "--target", str(site), "--upgrade", *map(str, todo)]
        print("  " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode:
            return "pip install failed"
    print(f"wheels: installed {len(todo)} into {site}")
    return None


def import_check(bundle: Path, site: Path) -> int:
    """Every module the harness imports, SITE first on the path (the runner put it there)."""
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            missing.append(f"{name} ({type(exc).__name__}: {str(exc)[:80]})")
    try:                                      # the peers as the harness imports them (mamba_ssm: its Triton op only)
        from baselines.peers import peer_status
        for name, status in peer_status().items():
            print(f"wheels: peer {name}: {status}")
    except Exception as exc:  # noqa: BLE001
        missing.append(f"baselines.peers ({type(exc).__name__}: {str(exc)[:80]})")
    if missing:
        print(f"wheels: the harness needs modules this box lacks: {'; '.join(missing)}. Make the bundle with "
              f"`bash scripts/gpu/gpu_bundle.sh {bundle} --full` (every dependency beyond torch/triton) and rerun.")
        return 1
    print(f"wheels: all {len(NEEDED)} harness modules import")
    made_for = [ln.split(":", 1)[1].split() for ln in (bundle / "MANIFEST.tsv").read_text().splitlines()
                if ln.startswith("# box-stack:")]
    if made_for:
        import torch
        import triton
        want = dict(x.split("==", 1) for x in made_for[0] if "==" in x)
        have = {"torch": torch.__version__, "triton": triton.__version__}
        if all(have.get(k) == v for k, v in want.items()):
            print(f"wheels: the bundle was made for this box's pair (torch {have['torch']}, triton {have['triton']})")
        else:
            print(f"wheels: NOT THE TESTED PAIR: the bundle was made for {' '.join(made_for[0])}, this box has "
                  f"torch=={have['torch']} triton=={have['triton']} (the bundle installs neither; results are "
                  "recorded)")
    return 0


def wheels_stage(bundle: Path, site: Path, dry: bool) -> int:
    error = install(bundle, site, dry)
    if error:
        print(f"wheels: {error}")
        return 1
    sys.stdout.flush()
    # a fresh process imports from SITE first, as every later stage will
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, "-m", "experiments.gpu_check.provenance", "imports", str(bundle),
                           str(site)], env=env, cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["env"] and len(argv) == 2:
        return env_stage(Path(argv[1]))
    if argv[:1] == ["wheels"] and len(argv) in (3, 4):
        return wheels_stage(Path(argv[1]), Path(argv[2]), dry=argv[3:] == ["--dry"])
    if argv[:1] == ["imports"] and len(argv) == 3:
        return import_check(Path(argv[1]), Path(argv[2]))
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
