"""Which experiments a sweep file belongs to, so `python -m experiments.kernel_decode sweep=e2e_cpu` says
"sweep=e2e_cpu is a sweep of e2e_decode, serving" instead of a Hydra composition error.

A conf/sweep/*.yaml names its structured schema in its defaults list; the schema says which experiments read
it. Every entry point registers all three schemas (`register_schemas`) so any sweep composes, then checks
the choice (`check_sweep`) before any work.
"""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
SCHEMA_EXPERIMENTS = {
    "schema": ("kernel_decode", "kernel_spec"),          # experiments/harness/points.py SweepSchema
    "hybrid_schema": ("e2e_decode", "serving"),          # experiments/hybrid/sweep.py HybridSweepSchema
    "accuracy_schema": ("accuracy",),                    # experiments/accuracy.py AccuracySweepSchema
}


def register_schemas() -> None:
    """Store every sweep schema in Hydra's ConfigStore (each module registers its own on import)."""
    import experiments.accuracy  # noqa: F401
    import experiments.harness.points  # noqa: F401
    import experiments.hybrid.sweep  # noqa: F401


def sweep_experiments(name: str) -> tuple[str, ...]:
    """The experiments that read conf/sweep/<name>.yaml (empty when the file names no known schema)."""
    from omegaconf import OmegaConf

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
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return
        name = HydraConfig.get().runtime.choices.get("sweep")
    owners = sweep_experiments(name) if name else ()
    if owners and experiment not in owners:
        ours = ", ".join(sweeps_of(experiment))
        raise ValueError(f"sweep={name}: a sweep of {', '.join(owners)} (python -m experiments.{owners[0]} "
                         f"sweep={name}), not of {experiment}; sweeps of {experiment}: {ours}")
