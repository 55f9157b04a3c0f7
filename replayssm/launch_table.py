"""Per-device launch tables: every Triton launch config of ReplaySSM and the baselines goes through here.

Each launch-config function computes its hand rule (the default) and passes it to `resolve(kernel, key,
state_dtype, arch, default)`, which returns the config to launch with:

    an active `override(kernel, cfg)`   -> cfg             (tuning trials, AOT builds of candidates)
    inside `use_defaults()`            -> the default     (a default baseline timed beside the tuned one)
    an entry of this device's table    -> tuned           (source "tuned")
    otherwise                          -> the default     (source "default")

A table is one small JSON file per device, replayssm/launch_tables/<device-slug>.json (the way vLLM keeps one
config file per GPU; REPLAYSSM_LAUNCH_TABLES points elsewhere, REPLAYSSM_LAUNCH_TABLES=off reads none: every
launch runs its default, as GPU first contact does), written by the tuner (experiments/tune.py):

    {"device": "nvidia_h200", "triton": "3.7.1", "torch": "...", "entries": {
        "<kernel>": {"<geometry key>|<state dtype>": {"config": {"num_warps": 8, ...}, "ms": .., "default_ms": ..}}}}

The key is (kernel name, geometry key, state dtype, device): `key` is the dict of the geometry fields the rule
reads (no batch: a config is tuned at one batch and kept for all). An entry holds only the fields it changes;
a field the default does not have makes the entry unusable (ignored, source "default"), so an old table can
never launch a config the kernel does not understand. The interpreter (arch 0) has its own device name,
"interpreter", so the CPU dry run exercises the same path; a GPU table is never read on a CPU.

`record()` collects every `Launch` resolved inside it (kernel, key, config, source): the kernel runner stores
them in each row (launch_source, launch_config); a row whose call resolved nothing ran no Triton kernel (n/a).
Not thread-safe: the override stack and recorders are module state, one launch at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from replayssm.checks import aot_capture_active
from replayssm.launch_registry import KERNELS
from replayssm.launch_registry import spec as launch_spec

TABLE_ENV = "REPLAYSSM_LAUNCH_TABLES"
DEFAULT_DIR = Path(__file__).parent / "launch_tables"
SOURCES = ("tuned", "default", "override", "n/a")

_overrides: list[tuple[str, object]] = []      # (kernel, cfg or dict of fields): innermost last
_defaults_depth = [0]
_recorders: list[list] = []
_tables: dict[tuple[str, str], dict] = {}       # (table dir, device) -> entries, loaded once
_memo: dict[tuple, tuple] = {}                  # resolve's lookups (see _lookup)


@dataclass(frozen=True)
class Launch:
    """One resolved launch config."""

    kernel: str
    key: str            # geometry key | state dtype
    device: str
    config: dict        # every field of the config launched with
    source: str         # tuned | default | override

    @property
    def label(self) -> str:
        """Compact: `kernel[f=v,...]` (the launch_config column)."""
        return f"{self.kernel}[{config_label(self.config)}]"


def config_label(config: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


def slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia_h200' (file-name safe)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "unknown"


def device_name(arch: int) -> str:
    """The table a launch for `arch` (checks.kernel_arch) reads: 'interpreter' for arch 0, else the current
    CUDA device's name, slugged; 'sm_<arch>' without CUDA or while an AOT build captures launches for a target
    (scripts/kernels/kernel_report.py: the default configs, unless a table for that name exists)."""
    if arch == 0:
        return "interpreter"
    if torch.cuda.is_available() and not aot_capture_active():     # an AOT build's target is not this GPU
        return slug(torch.cuda.get_device_name(torch.cuda.current_device()))
    return f"sm_{arch}"


def table_dir() -> Path:
    return Path(os.environ.get(TABLE_ENV) or DEFAULT_DIR)


def table_path(device: str, directory: Path | None = None) -> Path:
    return (directory or table_dir()) / f"{device}.json"


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "-"


def entry_key(key: dict, state_dtype) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(key.items())) + "|" + dtype_name(state_dtype)


def tables_off() -> bool:
    return os.environ.get(TABLE_ENV, "").strip().lower() == "off"


def load(device: str, directory: Path | None = None) -> dict:
    """The entries of `device`'s table ({} when it has none, or tables are off); cached until `reload()`."""
    if directory is None and tables_off():
        return {}
    directory = directory or table_dir()
    cache_key = (str(directory), device)
    if cache_key not in _tables:
        path = table_path(device, directory)
        _tables[cache_key] = json.loads(path.read_text()).get("entries", {}) if path.exists() else {}
    return _tables[cache_key]


def reload() -> None:
    """Forget the loaded tables (after the tuner wrote one, or REPLAYSSM_LAUNCH_TABLES changed)."""
    _tables.clear()
    _memo.clear()


def has_table(device: str, directory: Path | None = None) -> bool:
    return not (directory is None and tables_off()) and table_path(device, directory).exists()


def describe(arch: int) -> dict:
    """Which table launches for `arch` read (env.json of a run): device, path, entries per kernel, off."""
    device = device_name(arch)
    return {"device": device, "path": str(table_path(device)), "off": tables_off(),
            "entries": {k: len(v) for k, v in load(device).items()}}


def save(device: str, entries: dict, meta: dict, directory: Path | None = None) -> Path:
    """Merge `entries` ({kernel: {entry key: {"config": {...}, ...}}}) into `device`'s table file."""
    path = table_path(device, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update({k: v for k, v in meta.items() if k != "entries"}, device=device)
    merged = data.setdefault("entries", {})
    for kernel, per_key in entries.items():
        merged.setdefault(kernel, {}).update(per_key)
    data["entries"] = {k: dict(sorted(v.items())) for k, v in sorted(merged.items())}
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    reload()
    return path


def fields(cfg) -> dict:
    """The fields of a config: a dataclass, a NamedTuple or a dict."""
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    if hasattr(cfg, "_asdict"):
        return dict(cfg._asdict())
    return dict(cfg)


def apply(default, changes: dict):
    """`default` with `changes` applied, same type; KeyError for a field the default does not have."""
    unknown = set(changes) - set(fields(default))
    if unknown:
        raise KeyError(f"fields {sorted(unknown)} are not in the launch config")
    if dataclasses.is_dataclass(default):
        return dataclasses.replace(default, **changes)
    if hasattr(default, "_replace"):
        return default._replace(**changes)
    return {**default, **changes}


def _lookup(kernel: str, key: dict, state_dtype, arch: int) -> tuple[str, str, dict | None]:
    """(device, entry key, table entry or None), memoised: launches resolve on the host path of every step, so
    the file and name work happens once per (kernel, key, dtype, arch, REPLAYSSM_LAUNCH_TABLES) until
    `reload()`. One GPU model per process (a shard sets its device before its first launch)."""
    memo_key = (kernel, tuple(key.items()), state_dtype, arch, os.environ.get(TABLE_ENV))
    hit = _memo.get(memo_key)
    if hit is None:
        device, ekey = device_name(arch), entry_key(key, state_dtype)
        hit = _memo[memo_key] = (device, ekey, load(device).get(kernel, {}).get(ekey))
    return hit


def resolve(kernel: str, key: dict, state_dtype, arch: int, default):
    """The config to launch `kernel` with at this geometry (see the module docstring); records it. `kernel` must
    be declared in replayssm/launch_registry.py, whose key function built `key`."""
    if kernel not in KERNELS:
        launch_spec(kernel)                  # raises: the error names the declared kernels
    cfg, source = default, "default"
    forced = active_override(kernel) if _overrides else None
    if forced is not None:
        cfg = apply(default, forced) if isinstance(forced, dict) else forced
        source = "override"
    elif not _defaults_depth[0]:
        entry = _lookup(kernel, key, state_dtype, arch)[2]
        if entry is not None:
            try:
                cfg, source = apply(default, entry["config"]), "tuned"
            except (KeyError, TypeError):
                cfg, source = default, "default"      # an entry this kernel cannot use: never launched
    if _recorders:
        device, ekey, _ = _lookup(kernel, key, state_dtype, arch)
        for rec in _recorders:
            rec.append((kernel, ekey, device, cfg, source))
    return cfg


@contextlib.contextmanager
def override(kernel: str, cfg) -> Iterator[None]:
    """Every `kernel` launch inside uses `cfg` (a config of the kernel's own type, or a dict of fields)."""
    _overrides.append((kernel, cfg))
    try:
        yield
    finally:
        _overrides.pop()


def active_override(kernel: str):
    """The innermost override of `kernel`, or None."""
    for name, cfg in reversed(_overrides):
        if name == kernel:
            return cfg
    return None


@contextlib.contextmanager
def use_defaults() -> Iterator[None]:
    """Every launch inside uses its default rule (overrides still win): the default baseline."""
    _defaults_depth[0] += 1
    try:
        yield
    finally:
        _defaults_depth[0] -= 1


@contextlib.contextmanager
def record() -> Iterator[list[Launch]]:
    """The Launches resolved inside, in order (one per launch-config call); the list is filled when the block
    ends (raw tuples while it runs: recording stays cheap on the host path of a timed step)."""
    raw: list[tuple] = []
    log: list[Launch] = []
    _recorders.append(raw)
    try:
        yield log
    finally:
        _recorders.remove(raw)
        log.extend(Launch(kernel, ekey, device, fields(cfg), source) for kernel, ekey, device, cfg, source in raw)


def summarize(launches: list[Launch]) -> tuple[str, str]:
    """(launch_source, launch_config) of a row: n/a when nothing was resolved (no Triton launch); tuned when
    every launch was, default when none was, else "mixed"; the configs, one `kernel[...]` per distinct one."""
    if not launches:
        return "n/a", ""
    sources = {launch.source for launch in launches}
    source = "tuned" if sources == {"tuned"} else "default" if "tuned" not in sources else "mixed"
    if "override" in sources:
        source = "override"
    labels = list(dict.fromkeys(launch.label for launch in launches))
    return source, "; ".join(labels)


def tuned_entry(kernel: str, key: dict, state_dtype, arch: int) -> dict | None:
    """This device's table entry for the key, or None."""
    return load(device_name(arch)).get(kernel, {}).get(entry_key(key, state_dtype))
