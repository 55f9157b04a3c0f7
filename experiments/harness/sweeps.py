"""The sweep schemas of every experiment, and which experiments a sweep file belongs to, so
`python -m experiments.kernel_decode sweep=e2e_cpu` says "sweep=e2e_cpu is a sweep of e2e_decode, serving"
instead of a Hydra composition error.

A conf/sweep/*.yaml names its structured schema in its defaults list; the schema says which experiments read
it. The kernel schema lives with its validation (points.py); the hybrid and accuracy schemas live here, so
that registering them imports no experiment: importing this module stores all three in Hydra's ConfigStore,
and every entry point calls `register_schemas` so any sweep composes, then checks the choice
(`check_sweep`) before any work. Their default method / mode / workload names are the experiments'
vocabulary (experiments/hybrid/sweep.py and experiments/accuracy_series.py import them from here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from experiments.harness.points import CONF_DIR, SweepSchema

SCHEMA_EXPERIMENTS = {
    "schema": ("kernel_decode", "kernel_spec"),          # experiments/harness/points.py SweepSchema
    "hybrid_schema": ("e2e_decode", "serving"),          # HybridSweepSchema below
    "accuracy_schema": ("accuracy",),                    # AccuracySweepSchema below
}

SERVING_MODES = ("ar", "native", "replayssm", "commit_replay")      # serving: how the spec step is served
E2E_METHODS = ("baseline_ar", "replay_ar")                          # e2e_decode: the SSM layer's AR method
ACCURACY_METHODS = ("baseline_ar", "replay_ar", "baseline_spec", "commit_replay_spec", "replay_spec")
ACCURACY_WORKLOADS = ("realistic", "long_memory")


@dataclass
class HybridSweepSchema:
    """conf/sweep/{e2e_cpu,paper_e2e,serving_cpu,paper_serving}.yaml extend this (defaults: [hybrid_schema]);
    validated by experiments/hybrid/sweep.py."""

    models: list[str] = field(default_factory=lambda: ["tiny_mamba2"])
    batch: list[int] = field(default_factory=lambda: [1])
    context_len: list[int] = field(default_factory=lambda: [256])
    methods: list[str] = field(default_factory=lambda: list(E2E_METHODS))   # e2e_decode
    modes: list[str] = field(default_factory=lambda: list(SERVING_MODES))   # serving
    buffer_len: int | None = None           # null: the model's replayssm.buffer_len
    history_len: int | None = None          # null: the model's replayssm.history_len
    spec_T: list[int] = field(default_factory=lambda: [4])
    acceptance: list[Any] = field(default_factory=lambda: [{"kind": "rate", "p": 0.8}])
    spec_steps: int = 8                     # verify+commit steps per timed cycle (raised to pass >= 3 flushes)
    route: str = "output_only"              # replay_ar route (GDN / KDA off Triton: output_only only)
    spec_route: str = "fused"               # serving, mode replayssm: the ring verify's Triton form (SPEC_ROUTES)
    state_dtype: str = "float32"
    act_dtype: str = "float32"
    backend: str = "torch"
    build: str = "auto"                     # full | block (composed) | auto: block when weights > max_build_bytes
    max_build_bytes: int = 2_000_000_000
    max_model_len: int = 2048               # KV budget per sequence (context + decoded tokens must fit)
    moe_impl: str = "auto"
    hbm_bytes: int | None = None
    hbm_fallback_bytes: int = 80_000_000_000   # no hardware HBM and no GPU: an 80 GB H100 (the paper's dense GPU)
    hbm_util: float = 0.9                   # vLLM's gpu_memory_utilization default
    at_concurrency: bool = False            # serving: add a point per mode at its max concurrency (capped)
    concurrency_batch_cap: int = 1024
    # serving: a batch above a mode's max concurrency under the HBM budget is refused (`refuse`) or, in a
    # multi-model sweep whose at_concurrency point measures each mode's high end, left out and listed in the
    # run's env.json and console (`skip`)
    over_capacity: str = "refuse"
    vocab_cap: int | None = None            # CPU: truncate the (per-rank) LM head to this many rows (recorded)
    expert_cap: int | None = None           # CPU: build at most this many routed experts (>= top-k; recorded)
    threads: int | None = None
    cpu_repeats: int = 5
    cpu_warmup: int = 1


@dataclass
class AccuracySweepSchema:
    """conf/sweep/accuracy_*.yaml extend this (`defaults: [accuracy_schema, _self_]`); validated by
    experiments/accuracy.py."""

    models: list[str] = field(default_factory=lambda: ["nemotron3_super_120b", "qwen35_122b_a10b"])
    heads: int = 2                   # value heads kept of each model's real headdim/dstate (K/V)
    rows: int = 2                    # sequences decoded side by side
    steps: int = 2000                # tokens committed per series
    checkpoints: int = 12            # log-spaced checkpoints in 1..steps
    methods: list[str] = field(default_factory=lambda: list(ACCURACY_METHODS))
    workloads: list[str] = field(default_factory=lambda: list(ACCURACY_WORKLOADS))
    buffer_len: list[int] = field(default_factory=lambda: [4, 16])
    route: str = "output_only"       # replay_ar route (GDN / KDA off Triton: output_only only)
    spec_T: int = 4
    history_len: int = 16
    acceptance: str = "rate:0.7"
    state_dtype: list[str] = field(default_factory=lambda: ["float32", "bfloat16", "float16"])
    act_dtype: list[str] = field(default_factory=lambda: ["float32"])
    backend: str = "torch"
    # the non-plain state formats (float16_sr, bfloat16_sr, int8, float8_e4m3fn: torch / ref only) may run a
    # shorter decode and fewer workloads than the plain ones (a CPU budget: the baseline's SR write per step is
    # the slow part); null: `steps` / every workload
    formats_steps: int | None = None
    formats_workloads: list[str] | None = None


def register_schemas() -> None:
    """Store every sweep schema in Hydra's ConfigStore (idempotent: a name stored again is replaced)."""
    store = ConfigStore.instance()
    store.store(group="sweep", name="schema", node=SweepSchema)
    store.store(group="sweep", name="hybrid_schema", node=HybridSweepSchema)
    store.store(group="sweep", name="accuracy_schema", node=AccuracySweepSchema)


register_schemas()   # importing a schema's module registers it, as before the schemas moved here


def sweep_experiments(name: str) -> tuple[str, ...]:
    """The experiments that read conf/sweep/<name>.yaml (empty when the file names no known schema)."""
    path = CONF_DIR / "sweep" / f"{name}.yaml"
    if not path.exists():
        return ()
    defaults = OmegaConf.to_container(OmegaConf.load(path)).get("defaults") or []
    return next((SCHEMA_EXPERIMENTS[d] for d in defaults if isinstance(d, str) and d in SCHEMA_EXPERIMENTS), ())


def sweeps_of(experiment: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml") if experiment in sweep_experiments(p.stem))


def check_sweep(experiment: str, name: str | None = None) -> None:
    """Refuse a sweep of another experiment with one line naming both. `name`: the sweep group's choice
    (default: Hydra's runtime choice; nothing is checked outside a Hydra run)."""
    if name is None:
        if not HydraConfig.initialized():
            return
        name = HydraConfig.get().runtime.choices.get("sweep")
    owners = sweep_experiments(name) if name else ()
    if owners and experiment not in owners:
        ours = ", ".join(sweeps_of(experiment))
        raise ValueError(f"sweep={name}: a sweep of {', '.join(owners)} (python -m experiments.{owners[0]} "
                         f"sweep={name}), not of {experiment}; sweeps of {experiment}: {ours}")
