"""Engine config schema and expansion: composed config -> engine points (model x mode x bench x max-num-seqs).

Everything is validated before any process starts, with a ValueError naming the key. Config shape
(conf/vllm_bench.yaml): model (one conf/model entry), engine (conf/engine: executable and engine settings),
engine_sweep (conf/engine_sweep: what to sweep), hardware, out_dir, run_id, resume.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.config_store import ConfigStore

from experiments.harness.points import load_model_config
from experiments.vllm.commands import BENCHES, MODES, REPLAYSSM_MODES, SPEC_MODES, EnginePoint
from replayssm.checks import ROUTES

_MODEL_ENTRY = re.compile(r"^([A-Za-z0-9_]+)(?:@tp(\d+))?$")


@dataclass
class EngineSchema:
    name: str = "vllm"
    executable: str = "vllm"                 # a name on PATH or a path
    require_gpu: bool = True                 # no CUDA device -> every point skipped (CPU vLLM is not measured)
    ready_timeout_s: float = 1200.0          # vllm serve: weights + compile + CUDA-graph capture
    bench_timeout_s: float = 3600.0          # one vllm bench run
    probe_timeout_s: float = 180.0           # vllm --version / serve --help
    stop_grace_s: float = 30.0
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 2048
    seed: int = 0
    mtp_method: dict = field(default_factory=lambda: {"default": "mtp"})   # per model; "default" otherwise
    model_ids: dict = field(default_factory=dict)                         # model -> HF id override
    dataset_path: str | None = None          # local GSM8K-style jsonl ({"prompt": ...} a line); null: random


@dataclass
class EngineSweepSchema:
    models: list[str] | None = None          # null: the model group's choice; "name" or "name@tpN"
    modes: list[str] = field(default_factory=lambda: list(MODES))
    benches: list[str] = field(default_factory=lambda: list(BENCHES))
    max_num_seqs: list[int] = field(default_factory=lambda: [1])
    num_spec_tokens: int = 3                 # T = 4
    buffer_len: int = 16                     # ReplaySSM AR buffer L
    history_len: int = 16                    # ReplaySSM spec history B (>= T)
    route: str = "output_only"               # Mamba-2 AR route
    input_len: int = 128                     # random prompts only
    output_len: int = 256
    prompts_per_seq: int = 4                 # num_prompts = max(min_prompts, prompts_per_seq * max_num_seqs)
    min_prompts: int = 32
    temperature: float = 0.0                 # vllm bench serve; bench throughput fixes its own sampling


ConfigStore.instance().store(group="engine", name="schema", node=EngineSchema)
ConfigStore.instance().store(group="engine_sweep", name="schema", node=EngineSweepSchema)


@dataclass
class EnginePlan:
    points: list[EnginePoint]
    engine: dict
    sweep: dict


def point_hash(p: EnginePoint) -> str:
    return hashlib.sha256(json.dumps(p.key(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _pos_int(key: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{key}: expected a positive int, got {v!r}")
    return v


def _subset(key: str, values, allowed: tuple[str, ...]) -> list[str]:
    if not values:
        raise ValueError(f"{key}: empty; choose from {list(allowed)}")
    for i, v in enumerate(values):
        if v not in allowed:
            raise ValueError(f"{key}[{i}]: {v!r} is not one of {list(allowed)}")
    return list(values)


def _models(cfg: dict) -> list[tuple[dict, int]]:
    entries = cfg["engine_sweep"].get("models")
    if entries is None:
        model = cfg.get("model") or {}
        if not model.get("name"):
            raise ValueError("model: no model selected (model=<name> or engine_sweep.models=[...])")
        return [(model, int(model.get("tp") or 1))]
    out = []
    for i, entry in enumerate(entries):
        m = _MODEL_ENTRY.match(str(entry))
        if not m:
            raise ValueError(f"engine_sweep.models[{i}]: {entry!r} is not 'name' or 'name@tpN'")
        model = load_model_config(m.group(1))
        out.append((model, int(m.group(2)) if m.group(2) else int(model.get("tp") or 1)))
    return out


def expand(cfg: dict) -> EnginePlan:
    """Validate the engine config and list its points (run order: model, mode, bench, max-num-seqs)."""
    engine, sweep = dict(cfg["engine"]), dict(cfg["engine_sweep"])
    modes = _subset("engine_sweep.modes", sweep["modes"], MODES)
    benches = _subset("engine_sweep.benches", sweep["benches"], BENCHES)
    seqs = [_pos_int(f"engine_sweep.max_num_seqs[{i}]", v) for i, v in enumerate(sweep["max_num_seqs"])]
    if not seqs:
        raise ValueError("engine_sweep.max_num_seqs: empty")
    for key in ("num_spec_tokens", "buffer_len", "history_len", "input_len", "output_len", "prompts_per_seq",
                "min_prompts"):
        _pos_int(f"engine_sweep.{key}", sweep[key])
    _pos_int("engine.max_model_len", engine["max_model_len"])
    if sweep["route"] not in ROUTES:
        raise ValueError(f"engine_sweep.route: {sweep['route']!r} is not one of {list(ROUTES)}")
    T = 1 + sweep["num_spec_tokens"]
    if "replayssm_spec" in modes and sweep["history_len"] < T:
        raise ValueError(f"engine_sweep.history_len: B={sweep['history_len']} < T={T}; ReplaySSM spec needs B >= T")
    if not 0 < float(engine["gpu_memory_utilization"]) <= 1:
        raise ValueError(f"engine.gpu_memory_utilization: {engine['gpu_memory_utilization']!r} not in (0, 1]")
    if sweep["output_len"] + (0 if engine.get("dataset_path") else sweep["input_len"]) > engine["max_model_len"]:
        raise ValueError("engine.max_model_len: shorter than input_len + output_len")
    temperature = float(sweep["temperature"])
    if temperature < 0:
        raise ValueError(f"engine_sweep.temperature: {temperature} < 0")
    path = engine.get("dataset_path")
    if path is not None and not Path(path).is_file():
        raise ValueError(f"engine.dataset_path: {path} is not a file (a GSM8K-style jsonl, one {{\"prompt\": ...}} "
                         "a line; null for random prompts)")
    mtp = dict(engine.get("mtp_method") or {})
    ids = dict(engine.get("model_ids") or {})
    points = []
    for model, tp in _models(cfg):
        name = model["name"]
        hf_id = ids.get(name) or model.get("hf_id")
        if not hf_id:
            raise ValueError(f"model {name}: no hf_id (set engine.model_ids.{name})")
        for mode in modes:
            for bench in benches:
                for n in seqs:
                    spec, replay = mode in SPEC_MODES, mode in REPLAYSSM_MODES
                    points.append(EnginePoint(
                        model=name, hf_id=str(hf_id), family=model["family"], tp=tp, mode=mode, bench=bench,
                        max_num_seqs=n, num_spec_tokens=sweep["num_spec_tokens"] if spec else None,
                        buffer_len=(sweep["history_len"] if spec else sweep["buffer_len"]) if replay else None,
                        route=sweep["route"] if mode == "replayssm_ar" and model["family"] == "mamba2" else None,
                        mtp_method=str(mtp.get(name, mtp.get("default", "mtp"))) if spec else None,
                        dataset="gsm8k" if path else "random", dataset_path=path,
                        input_len=sweep["input_len"], output_len=sweep["output_len"],
                        num_prompts=max(sweep["min_prompts"], sweep["prompts_per_seq"] * n),
                        temperature=temperature if bench == "serve" else None,
                        max_model_len=engine["max_model_len"],
                        gpu_memory_utilization=float(engine["gpu_memory_utilization"]), seed=int(engine["seed"])))
    return EnginePlan(points=points, engine=engine, sweep=sweep)
