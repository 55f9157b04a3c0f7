"""Provenance of a run (env.json) and the hardware profile it is filed under.

Fields (what a GPU benchmark needs to be read later): hostname, platform, python, CPU name, threads, torch, triton,
CUDA, peers' versions (mamba_ssm, fla, flashinfer), git sha + dirty flag, GPU name / UUID / count / memory /
SM count / compute capability / L2, driver and CUDA driver versions, clocks, power limit, throttle
(clock-event) reasons, persistence mode (NVML, each reading absent when NVML is missing or fails), the
hardware profile with its datasheet peaks, the measured copy bandwidth, and the timing mode / L2 policy.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[2]
PEERS = {"mamba_ssm": ("mamba-ssm", "mamba_ssm"), "fla": ("flash-linear-attention", "fla-core"),
         "flashinfer": ("flashinfer-python", "flashinfer")}


def _run(*cmd: str) -> str | None:
    try:
        return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def git_info() -> dict:
    """sha (None outside a git checkout) and dirty (tracked files modified)."""
    sha = _run("git", "rev-parse", "HEAD")
    status = _run("git", "status", "--porcelain", "--untracked-files=no")
    return {"git_sha": sha.strip() if sha else None, "git_dirty": bool(status.strip()) if status is not None else None}


SHORT_SHA_LEN = 7  # the same length as `git rev-parse --short` (scripts/reproduce.sh names its runs with it)


def short_sha() -> str:
    sha = git_info()["git_sha"]
    return sha[:SHORT_SHA_LEN] if sha else "nogit"


def new_run_id() -> str:
    """UTC timestamp + short git sha, e.g. 20260901T101500Z-1a2b3c4."""
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{short_sha()}"


def package_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def cpu_llc(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict:
    """The CPU's last-level data cache from sysfs: {"llc_bytes", "llc_level", "llc_source"}, or llc_bytes
    None when sysfs does not say (then os.sysconf's LEVEL3/LEVEL2 size, where the libc knows it).

    The CPU timing path sizes its layer stack from this exactly as the GPU path does from L2, so a cold
    CPU point streams its state from DRAM rather than from a cache that holds it."""
    best: tuple[int, int] | None = None
    for index in sorted(cache_dir.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)B?", size)
        if kind == "Instruction" or match is None:
            continue
        nbytes = int(match.group(1)) * _SIZE_UNITS[match.group(2)]
        if best is None or level > best[0]:
            best = (level, nbytes)
    if best is not None:
        return {"llc_bytes": best[1], "llc_level": best[0], "llc_source": str(cache_dir)}
    for level, name in ((3, "SC_LEVEL3_CACHE_SIZE"), (2, "SC_LEVEL2_CACHE_SIZE")):
        try:
            nbytes = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if nbytes and nbytes > 0:
            return {"llc_bytes": int(nbytes), "llc_level": level, "llc_source": f"os.sysconf({name})"}
    return {"llc_bytes": None, "llc_level": None, "llc_source": None}


def _clock_event_reasons(pynvml):
    """nvmlDeviceGetCurrentClocksEventReasons (newer name) or ...ThrottleReasons (older): a bitmask."""
    return getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons


def nvml_info(index: int = 0) -> dict:
    """Driver, clocks, throttle reasons, power, persistence, memory via NVML; {'nvml': 'absent: ...'} if not."""
    try:
        import pynvml
    except ImportError:
        return {"nvml": "absent: pynvml not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"nvml": f"absent: {exc}"}
    out: dict = {"nvml": "present"}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        readings = {
            "driver_version": lambda: pynvml.nvmlSystemGetDriverVersion(),
            "cuda_driver_version": lambda: pynvml.nvmlSystemGetCudaDriverVersion(),
            "gpu_uuid": lambda: pynvml.nvmlDeviceGetUUID(h),
            "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "throttle_reasons": lambda: int(_clock_event_reasons(pynvml)(h)),
            "power_limit_w": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,
            "persistence_mode": lambda: pynvml.nvmlDeviceGetPersistenceMode(h),
            "memory_used_bytes": lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).used),
            "memory_total_bytes": lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
        }
        for key, read in readings.items():
            try:
                value = read()
                out[key] = value.decode() if isinstance(value, bytes) else value
            except (pynvml.NVMLError, AttributeError) as exc:
                out[key] = f"absent: {exc}"
    except pynvml.NVMLError as exc:
        out["nvml"] = f"absent: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return out


def gpu_info() -> dict:
    if not torch.cuda.is_available():
        return {"gpu_name": None, "gpu_count": 0}
    props = torch.cuda.get_device_properties(0)
    return {"gpu_name": props.name, "gpu_count": torch.cuda.device_count(), "sm_count": props.multi_processor_count,
            "compute_capability": f"{props.major}.{props.minor}", "gpu_memory_bytes": int(props.total_memory),
            "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None}


# ---------------------------------------------------------------------------------------------- hardware

def _profiles(conf_dir: Path) -> dict[str, dict]:
    return {p.stem: OmegaConf.to_container(OmegaConf.load(p), resolve=True)
            for p in sorted((conf_dir / "hardware").glob("*.yaml")) if p.stem != "auto"}


def _matches(profile: dict, device_name: str) -> bool:
    name = device_name.upper()
    return (any(m.upper() in name for m in profile.get("device_match") or [])
            and not any(x.upper() in name for x in profile.get("device_exclude") or []))


def resolve_hardware(hw: dict, device: str, conf_dir: Path) -> dict:
    """The hardware profile of this run. `auto` detects it from the device name; an explicit profile
    that contradicts the device raises ValueError (rows would be filed under the wrong hardware)."""
    name = (hw or {}).get("name", "auto")
    profiles = _profiles(conf_dir)
    if device == "cpu":
        if name not in ("auto", "cpu"):
            raise ValueError(f"hardware={name} but this run is on the CPU; use hardware=auto or hardware=cpu")
        # The CPU's "L2" of the stack rule is its last-level cache, read from the machine (a profile's
        # l2_bytes is the fallback where sysfs / sysconf do not say).
        hw = dict(profiles.get("cpu", {"name": "cpu"}) if name == "auto" else hw)
        llc = cpu_llc()
        hw.update(llc)
        hw["l2_source"] = f"cpu llc (L{llc['llc_level']}, {llc['llc_source']})" if llc["llc_bytes"] else \
            ("config" if hw.get("l2_bytes") else None)
        hw["l2_bytes"] = llc["llc_bytes"] or hw.get("l2_bytes")
        return hw
    gpu = torch.cuda.get_device_properties(0).name
    if name == "auto":
        found = [p for p in profiles.values() if _matches(p, gpu)]
        hw = found[0] if found else {"name": re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_"),
                                     "peak_hbm_TBps": None, "l2_bytes": None, "note": "no profile matched"}
    elif name == "cpu" or not _matches(hw, gpu):
        raise ValueError(f"hardware={name} does not match the device {gpu!r}; use hardware=auto")
    hw = dict(hw)
    l2 = gpu_info().get("l2_bytes")
    hw["l2_source"] = "device" if l2 else ("config" if hw.get("l2_bytes") else None)
    hw["l2_bytes"] = l2 or hw.get("l2_bytes")
    return hw


def collect_env(*, device: str, hardware: dict, timing: dict, sweep: dict) -> dict:
    """The env.json of a run."""
    env = {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_name": cpu_name(),
        "cpu_count": os.cpu_count(),
        **{f"cpu_{k}": v for k, v in cpu_llc().items()},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "cuda": torch.version.cuda,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
        "peers": {peer: package_version(*names) for peer, names in PEERS.items()},
        **git_info(),
        "device": device,
        **gpu_info(),
        "hardware": hardware,
        "timing_mode": sweep.get("timing_mode"),
        "l2_policy": sweep.get("l2"),
        "backend": sweep.get("backend"),
        "timing": timing,
    }
    env.update(nvml_info() if device == "cuda" else {"nvml": "absent: CPU run"})
    return env
