"""Sweep expansion and validation: a composed config -> the list of points to check and time.

Everything is validated here, before any allocation or timing, with a ValueError that names the key
(`sweep.batch[2]: expected a positive int, got 'x'`). A point is one (config, method) pair; it becomes
exactly one row. `config_hash` identifies it across resumes of a run.

Config shape (conf/config.yaml): model (one model spec), method.names, hardware, sweep, experiment,
timing, seed, device. `sweep.models` (names, "name@tpN" for a TP split) overrides the model group.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from experiments.harness.acceptance import Acceptance, parse_acceptance
from experiments.harness.bandwidth import MODES as COLD_PROBE_MODES
from experiments.harness.methods import REGISTRY, Method
from experiments.harness.serving_shape import cursor_period, parse_cursors
from replayssm import state_format as sf
from replayssm.checks import ROUTES, SPEC_ROUTES, interpreter_active
from replayssm.geometry import GDN_MODELS, KDA_MODELS, MAMBA2_MODELS, GDNGeometry, KDAGeometry, Mamba2Geometry

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
FAMILIES = ("mamba2", "gdn", "kda")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
# A state is any format of replayssm/state_format.py: the plain dtypes and the stochastic-rounding and scaled 8-bit
# ones (a backend refuses a format its kernels lack before any launch: the point's row records why)
STATE_DTYPES = sf.FORMAT_NAMES
ACT_DTYPES = ("float32", "float16", "bfloat16")
TIMING_MODES = ("graph", "eager", "auto")   # auto: graph on a GPU (Triton backend), else eager
L2_MODES = ("cold", "warm")
BACKENDS = ("triton", "torch", "cpu")   # cpu: the fused C/OpenMP kernels (replayssm/cpu), CPU only
SLOT_LAYOUTS = ("identity", "permuted")
EXPERIMENT_KINDS = ("ar", "spec")
_MODEL_ENTRY = re.compile(r"^([A-Za-z0-9_]+)(?:@tp(\d+))?$")


# ------------------------------------------------------------------------------- structured config schemas
# Every conf/sweep/*.yaml and conf/hardware/*.yaml extends these (`defaults: [schema, _self_]`), so Hydra
# rejects a misspelt key or a value of the wrong type while composing; `expand` re-checks the values (the
# plain-dict path never meets Hydra) and the semantics (B >= T, dtypes, devices) with key-naming messages.
# typing.Optional/List are what OmegaConf's schema reader understands.

@dataclass
class SweepSchema:
    models: list[str] | None = None          # null: the model group's choice; "name" or "name@tpN"
    batch: list[int] = field(default_factory=lambda: [1])
    buffer_len: list[int] = field(default_factory=lambda: [16])
    routes: list[str] = field(default_factory=lambda: ["output_only", "state_and_output"])
    spec_routes: list[str] = field(default_factory=lambda: ["fused"])   # the ring verify's Triton forms (SPEC_ROUTES)
    spec_T: list[int] = field(default_factory=lambda: [4])
    history_len: list[int] = field(default_factory=lambda: [16])
    acceptance: list[Any] = field(default_factory=list)  # {kind: rate, p: 0.8} or a label "rate:0.8"
    state_dtype: list[str] = field(default_factory=lambda: ["float32"])
    act_dtype: list[str] = field(default_factory=lambda: ["bfloat16"])
    backend: str = "triton"
    timing_mode: str = "graph"
    l2: str = "cold"
    torch_compile: Any = False                   # true | false | auto
    slot_layout: str = "identity"
    # Production shape (experiments/harness/fixture.py): the rows' cursor layouts ("aligned", "staggered", or a
    # write position "h=k" / k) and the pool's size as a multiple of the batch (rows map into a sparse pool).
    cursors: list[Any] = field(default_factory=lambda: ["aligned"])
    pool_factor: list[int] = field(default_factory=lambda: [1])
    threads: int | None = None
    # Sweep keys that replace the ones above when the run is on a CPU (device chosen at run time), so one
    # sweep (smoke) runs anywhere: e.g. {models: [tiny_mamba2, tiny_gdn], backend: torch, act_dtype: [float32]}
    on_cpu: dict[str, Any] | None = None


@dataclass
class HardwareSchema:
    name: str = "auto"
    device_match: list[str] = field(default_factory=list)
    device_exclude: list[str] = field(default_factory=list)
    peak_hbm_TBps: float | None = None
    peak_fp32_simt_TFLOPs: float | None = None
    peak_bf16_tensor_TFLOPs: float | None = None
    l2_bytes: int | None = None
    hbm_bytes: int | None = None


ConfigStore.instance().store(group="sweep", name="schema", node=SweepSchema)
ConfigStore.instance().store(group="hardware", name="schema", node=HardwareSchema)
SWEEP_KEYS = tuple(SweepSchema.__dataclass_fields__)


@dataclass(frozen=True)
class ModelSpec:
    """One model at one TP degree: the geometry a rank's kernel sees plus what the inputs need."""

    name: str
    family: str
    tp: int
    geometry: Mamba2Geometry | GDNGeometry | KDAGeometry
    has_z: bool = False
    dt_softplus: bool = True
    use_qk_l2norm: bool = False
    ssm_layers: int | None = None

    @property
    def key(self) -> str:
        return f"{self.name}@tp{self.tp}"


@dataclass(frozen=True)
class Point:
    """One row to produce. Fields that do not apply to the method are None (empty in rows.csv)."""

    experiment: str
    family: str
    model: str
    tp: int
    method: str
    route: str | None
    backend: str
    batch: int
    buffer_len: int | None
    spec_T: int | None
    history_len: int | None
    acceptance: str | None
    state_dtype: str
    act_dtype: str
    context_len: int | None
    timing_mode: str
    l2: str
    torch_compile: str
    slot_layout: str
    device: str
    seed: int
    geometry: tuple = field(default=())
    cursors: str | None = None          # a method with a cursor: aligned | staggered | h=k (None: no cursor)
    num_slots: int = 0                  # slots in the pool the rows map into; 0: exactly the batch

    @property
    def model_key(self) -> str:
        return f"{self.model}@tp{self.tp}"

    @property
    def pool_slots(self) -> int:
        return self.num_slots or self.batch

    def config_hash(self) -> str:
        fields = asdict(self)
        # The production-shape keys enter the hash only away from their defaults, so every point of a run made
        # before they existed keeps its hash (its rows still resume and pair).
        if fields["cursors"] in (None, "aligned"):
            del fields["cursors"]
        if fields["num_slots"] in (0, self.batch):
            del fields["num_slots"]
        blob = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Plan:
    """Validated sweep: the points in run order, the models and acceptance models they refer to."""

    experiment: str
    kind: str
    device: str
    points: list[Point]
    models: dict[str, ModelSpec]
    acceptances: dict[str, Acceptance]
    timing: dict
    hardware: dict


# ----------------------------------------------------------------------------------------------- helpers

def _int(key: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key}: expected an int >= {minimum}, got {v!r} ({type(v).__name__})")
    if v < minimum:
        raise ValueError(f"{key}: expected an int >= {minimum}, got {v}")
    return v


def _int_list(sweep: dict, key: str, minimum: int = 1) -> list[int]:
    values = sweep.get(key)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"sweep.{key}: expected a non-empty list of ints, got {values!r}")
    return [_int(f"sweep.{key}[{i}]", v, minimum) for i, v in enumerate(values)]


def _choice(key: str, v, allowed: tuple[str, ...]) -> str:
    if v not in allowed:
        raise ValueError(f"{key}: unknown value {v!r}; expected one of {list(allowed)}")
    return v


def _dtype_list(sweep: dict, key: str, allowed: tuple[str, ...]) -> list[str]:
    values = sweep.get(key)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"sweep.{key}: expected a non-empty list of dtype names, got {values!r}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, str) and v in allowed and v in sf.FORMATS:     # a state format's own name
            out.append(v)
            continue
        if not isinstance(v, str) or v not in DTYPES:
            raise ValueError(f"sweep.{key}[{i}]: unknown dtype {v!r}; expected one of {list(allowed)}")
        name = str(DTYPES[v]).removeprefix("torch.")
        if name not in allowed:
            raise ValueError(f"sweep.{key}[{i}]: dtype {name} is not allowed here; expected one of {list(allowed)}")
        out.append(name)
    return out


def _compile_flag(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v in ("true", "false", "auto"):
        return v
    raise ValueError(f"sweep.torch_compile: expected true, false or auto, got {v!r}")


# timing.* (conf/config.yaml): key -> (type, smallest allowed value, whether the minimum itself is allowed).
# Checked before any work like the sweep, so `timing.cpu_repeats=abc` or `=0` is a one-line error, not a run
# directory full of failed points.
TIMING_KEYS: dict[str, tuple[type, float, bool]] = {
    "warmup_ms": (float, 0, True), "rep_ms": (float, 0, False), "l2_factor": (float, 0, False),
    "max_layers": (int, 1, True), "hbm_budget_frac": (float, 0, False), "cpu_warmup": (int, 0, True),
    "cpu_repeats": (int, 1, True), "cpu_min_sample_us": (float, 0, True), "spec_steps": (int, 1, True),
    "check_max_batch": (int, 1, True), "check_ar_steps": (int, 1, True), "copy_bytes": (int, 1, True),
}
TIMING_CHOICES = {"cpu_clock": ("auto", "wall", "cpu"), "compile_backend": None,   # None: any non-empty name
                  "cpu_cold_probe": COLD_PROBE_MODES}


def validate_timing(timing: dict) -> dict:
    """Check every timing.* key (type and range, hbm_budget_frac <= 1) and refuse unknown ones."""
    for key, v in timing.items():
        if key in TIMING_CHOICES:
            allowed = TIMING_CHOICES[key]
            if allowed is None:
                if not isinstance(v, str) or not v:
                    raise ValueError(f"timing.{key}: expected a non-empty name, got {v!r}")
            else:
                _choice(f"timing.{key}", v, allowed)
            continue
        if key not in TIMING_KEYS:
            raise ValueError(f"timing.{key}: unknown timing key; expected one of "
                             f"{sorted([*TIMING_KEYS, *TIMING_CHOICES])}")
        kind, low, inclusive = TIMING_KEYS[key]
        ok_type = not isinstance(v, bool) and (isinstance(v, int) if kind is int else isinstance(v, (int, float)))
        what = ("an int" if kind is int else "a number") + (f" >= {low:g}" if inclusive else f" > {low:g}")
        if key == "hbm_budget_frac":
            what += " and <= 1"
        if not ok_type or (v < low if inclusive else v <= low) or (key == "hbm_budget_frac" and v > 1):
            raise ValueError(f"timing.{key}: expected {what}, got {v!r}")
    return timing


def resolve_device(device) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: expected auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda requested but torch.cuda.is_available() is False")
    return device


def known_models() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def load_model_config(name: str) -> dict:
    """The model group's YAML for `name` (conf/model/<name>.yaml) as a plain dict."""
    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"model: unknown model {name!r}; known models: {', '.join(known_models())}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def model_spec(cfg: dict, tp: int | None, key: str = "model") -> ModelSpec:
    """Validate a model config dict and split its geometry for tensor parallelism."""
    name, family = cfg.get("name"), cfg.get("family")
    if family not in FAMILIES:
        raise ValueError(f"{key}.family: unknown SSM family {family!r}; expected one of {list(FAMILIES)}")
    geo = cfg.get("geometry") or {}
    try:
        geometry = {"mamba2": Mamba2Geometry, "gdn": GDNGeometry, "kda": KDAGeometry}[family](**geo)
    except TypeError as exc:
        raise ValueError(f"{key}.geometry: {exc}") from None
    reference = {**MAMBA2_MODELS, **GDN_MODELS, **KDA_MODELS}.get(name)
    if reference is not None and reference != geometry:
        raise ValueError(f"{key}.geometry of {name} disagrees with replayssm.geometry: {geometry} vs {reference}")
    tp = _int(f"{key}.tp", cfg.get("tp", 1) if tp is None else tp)
    try:
        geometry = geometry.tp_split(tp) if tp > 1 else geometry
    except ValueError as exc:
        raise ValueError(f"{key}.tp: {exc}") from None
    layers = cfg.get("layers") or {}
    return ModelSpec(name=name, family=family, tp=tp, geometry=geometry, has_z=bool(cfg.get("has_z")),
                     dt_softplus=cfg.get("dt_softplus") is not False, use_qk_l2norm=bool(cfg.get("use_qk_l2norm")),
                     ssm_layers=layers.get("ssm"))


def _models(cfg: dict) -> list[ModelSpec]:
    sweep, chosen = cfg["sweep"], cfg.get("model") or {}
    entries = sweep.get("models")
    if entries is None:
        if not chosen.get("name"):
            raise ValueError("model: no model chosen (set model=<name> or sweep.models)")
        return [model_spec(chosen, None)]
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"sweep.models: expected null or a non-empty list of model names, got {entries!r}")
    specs = []
    for i, entry in enumerate(entries):
        match = _MODEL_ENTRY.match(entry) if isinstance(entry, str) else None
        if match is None:
            raise ValueError(f"sweep.models[{i}]: expected 'name' or 'name@tpN', got {entry!r}")
        name, tp = match.group(1), match.group(2)
        base = chosen if chosen.get("name") == name else load_model_config(name)
        specs.append(model_spec(base, int(tp) if tp else None, key=f"sweep.models[{i}]"))
    return specs


def _methods(cfg: dict, kind: str) -> list[Method]:
    names = list((cfg.get("method") or {}).get("names") or [])
    names += [n for n in (cfg["experiment"].get("reference_methods") or []) if n not in names]
    if not names:
        raise ValueError("method.names: no method selected")
    for i, n in enumerate(names):
        if n not in REGISTRY:
            raise ValueError(f"method.names[{i}]: unknown method {n!r}; known methods: {', '.join(REGISTRY)}")
    reference = set(cfg["experiment"].get("reference_methods") or [])
    chosen = [REGISTRY[n] for n in names if REGISTRY[n].kind == kind or n in reference]
    if not chosen:
        raise ValueError(f"method.names: none of {names} is a {kind!r} method (experiment {cfg['experiment']['name']})")
    return chosen


def device_sweep(sweep: dict, device: str) -> dict:
    """The sweep as it applies on `device`: on a CPU, `on_cpu`'s keys replace the sweep's own."""
    over = sweep.get("on_cpu")
    if over is None:
        return sweep
    if not isinstance(over, dict):
        raise ValueError(f"sweep.on_cpu: expected null or a mapping of sweep keys, got {over!r}")
    bad = sorted(set(over) - set(SWEEP_KEYS) | ({"on_cpu"} & set(over)))
    if bad:
        raise ValueError(f"sweep.on_cpu.{bad[0]}: not a sweep key that can be replaced on a CPU")
    return {**sweep, **over} if device == "cpu" else sweep


# ------------------------------------------------------------------------------------------------ expand

def expand(cfg) -> Plan:
    """Validate `cfg` (DictConfig or dict) and expand it into points. Raises ValueError naming the key."""
    if not isinstance(cfg, dict):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    for section in ("sweep", "experiment", "timing"):
        if not isinstance(cfg.get(section), dict):
            raise ValueError(f"{section}: missing config section")
    sweep, exp = cfg["sweep"], cfg["experiment"]
    unknown = sorted(set(sweep) - set(SWEEP_KEYS))
    if unknown:
        raise ValueError(f"sweep.{unknown[0]}: unknown sweep key; expected one of {list(SWEEP_KEYS)}")
    kind = _choice("experiment.kind", exp.get("kind"), EXPERIMENT_KINDS)
    device = resolve_device(cfg.get("device", "auto"))
    seed = _int("seed", cfg.get("seed", 0), minimum=0)
    sweep = device_sweep(sweep, device)
    cfg = dict(cfg, sweep=sweep)
    validate_timing(cfg["timing"])
    if not isinstance(cfg.get("progress", True), bool):
        raise ValueError(f"progress: expected true or false, got {cfg['progress']!r}")

    backend = _choice("sweep.backend", sweep.get("backend"), BACKENDS)
    timing_mode = _choice("sweep.timing_mode", sweep.get("timing_mode"), TIMING_MODES)
    if timing_mode == "auto":            # the row records what was used, never "auto"
        timing_mode = "graph" if device == "cuda" and backend == "triton" else "eager"
    l2 = _choice("sweep.l2", sweep.get("l2"), L2_MODES)
    compile_flag = _compile_flag(sweep.get("torch_compile", False))
    slot_layout = _choice("sweep.slot_layout", sweep.get("slot_layout", "identity"), SLOT_LAYOUTS)
    if sweep.get("threads") is not None:
        _int("sweep.threads", sweep["threads"])
    batches = _int_list(sweep, "batch")
    layouts = [parse_cursors(c, f"sweep.cursors[{i}]") for i, c in enumerate(sweep.get("cursors") or ["aligned"])]
    pool_factors = _int_list(dict(pool_factor=sweep.get("pool_factor") or [1]), "pool_factor")
    state_dtypes = _dtype_list(sweep, "state_dtype", STATE_DTYPES)
    act_dtypes = _dtype_list(sweep, "act_dtype", ACT_DTYPES)
    routes = [_choice(f"sweep.routes[{i}]", r, ROUTES) for i, r in enumerate(sweep.get("routes") or [])]
    spec_routes = [_choice(f"sweep.spec_routes[{i}]", r, SPEC_ROUTES)
                   for i, r in enumerate(sweep.get("spec_routes") or ["fused"])]
    buffer_lens = _int_list(sweep, "buffer_len") if kind == "ar" else []
    spec_Ts = _int_list(sweep, "spec_T") if kind == "spec" else []
    history_lens = _int_list(sweep, "history_len") if kind == "spec" else []
    accs = [parse_acceptance(a, f"sweep.acceptance[{i}]") for i, a in enumerate(sweep.get("acceptance") or [])]
    if kind == "spec" and not accs:
        raise ValueError("sweep.acceptance: a spec experiment needs at least one acceptance model")
    if kind == "ar" and not routes:
        raise ValueError("sweep.routes: expected a non-empty list of replay routes")

    if device == "cpu":
        if timing_mode == "graph":
            raise ValueError("sweep.timing_mode=graph needs a CUDA device; use eager on CPU (sweep=cpu)")
        if any(sf.FORMATS[d].storage == torch.bfloat16 for d in state_dtypes) and backend != "cpu":
            raise ValueError("sweep.state_dtype: a bfloat16 state is not timed on CPU (the Triton interpreter computes "
                             "bf16 on raw bits); experiments.accuracy measures its error on CPU")
        if "bfloat16" in act_dtypes and backend != "cpu":
            raise ValueError("sweep.act_dtype: bfloat16 is not timed on CPU (the Triton interpreter computes bf16 "
                             "on raw bits and CPU bf16 is not a target); use float32/float16")
        if backend == "triton":
            if not interpreter_active():
                raise ValueError("sweep.backend=triton on CPU needs TRITON_INTERPRET=1 (correctness only, never "
                                 "timed); use backend=torch to time on CPU")
    if backend == "cpu" and device != "cpu":
        raise ValueError("sweep.backend=cpu runs the C/OpenMP kernels on CPU tensors; on a GPU use backend=triton")
    if backend == "torch" and timing_mode == "graph":
        raise ValueError("sweep.timing_mode=graph with backend=torch: the torch backends read cursors on the host "
                         "(data-dependent flushes), so they cannot be graph-captured; use timing_mode=eager")
    if compile_flag != "false" and backend != "torch":
        raise ValueError(f"sweep.torch_compile={compile_flag} applies to backend=torch only (backend={backend})")
    for i, T in enumerate(spec_Ts):
        for j, B in enumerate(history_lens):
            if B < T:
                raise ValueError(f"sweep.history_len[{j}]: history B={B} < spec window T={T} (sweep.spec_T[{i}]); "
                                 "the ring needs B >= T")

    models = _models(cfg)
    methods = _methods(cfg, kind)
    reference = set(exp.get("reference_methods") or [])
    common = dict(experiment=exp["name"], backend=backend, context_len=None, timing_mode=timing_mode, l2=l2,
                  torch_compile=compile_flag, slot_layout=slot_layout, device=device, seed=seed)
    points: list[Point] = []
    for spec in models:
        geo = tuple(sorted(asdict(spec.geometry).items()))
        for method in methods:
            if spec.family not in method.families:
                continue
            for batch in batches:
                for factor in pool_factors:
                    for sd in state_dtypes:
                        for ad in act_dtypes:
                            base = dict(common, family=spec.family, model=spec.name, tp=spec.tp,
                                        method=method.name, batch=batch, state_dtype=sd, act_dtype=ad, geometry=geo,
                                        backend=method.backend_for(backend, spec.family), num_slots=batch * factor)
                            new = _method_points(method, base, spec.family, kind, method.name in reference,
                                                 buffer_lens, routes, spec_Ts, history_lens, accs, spec_routes)
                            points += _with_cursors(method, new, layouts)
    if not points:
        raise ValueError("sweep: no point to run (no selected method applies to the selected models)")
    return Plan(experiment=exp["name"], kind=kind, device=device, points=points,
                models={m.key: m for m in models}, acceptances={a.label: a for a in accs},
                timing=dict(cfg["timing"]), hardware=dict(cfg.get("hardware") or {}))


def _method_points(method: Method, base: dict, family: str, kind: str, is_reference: bool, buffer_lens, routes,
                   spec_Ts, history_lens, accs, spec_routes=("fused",)) -> list[Point]:
    """A spec method with Triton forms (replay_spec: SPEC_ROUTES) gets a point per requested form; the default
    form ("fused") keeps route None, so its points hash as they did before the forms existed."""
    empty = dict(route=None, buffer_len=None, spec_T=None, history_len=None, acceptance=None)
    if method.kind == "ar":
        if not method.uses_buffer or is_reference:
            return [Point(**base, **empty)]
        method_routes = [r for r in routes if r in method.routes(family, base["backend"])]
        return [Point(**base, **dict(empty, route=r, buffer_len=L)) for L in buffer_lens for r in method_routes]
    forms = method.routes(family, base["backend"])
    forms = [None] if forms == (None,) else [None if r == "fused" else r for r in spec_routes if r in forms]
    out = []
    for T in spec_Ts:
        for acc in accs:
            hist = history_lens if method.uses_history else [None]
            out += [Point(**base, **dict(empty, spec_T=T, acceptance=acc.label, history_len=B, route=r))
                    for B in hist for r in forms]
    return out


def _with_cursors(method: Method, points: list[Point], layouts: list[str]) -> list[Point]:
    """Each point once per cursor layout when its method has a cursor (else once, cursors=None); a fixed
    position must lie inside the cursor's cycle (checked here, before anything runs)."""
    out = []
    for p in points:
        period = cursor_period(method, p)
        if period is None:
            out.append(p)
            continue
        for layout in layouts:
            if layout.startswith("h=") and int(layout[2:]) >= period:
                raise ValueError(f"sweep.cursors: {layout} is past the cursor's cycle of {method.name} "
                                 f"({period} positions at {_cycle_label(p)})")
            out.append(replace(p, cursors=layout))
    return out


def _cycle_label(p: Point) -> str:
    return f"L={p.buffer_len}" if p.spec_T is None else f"B={p.history_len}, T={p.spec_T}"
