"""What every experiment's entry point shares: compose a config without the Hydra runtime, turn it into a
plain dict, run under Hydra, keep the user's typed sweep keys, and exit non-zero when nothing was measured.

    from experiments.harness.entry import load_config
    from experiments.kernel.run import run_experiment
    result = run_experiment(load_config("kernel_decode", ["sweep=cpu", "sweep.batch=[1]"]))

The experiment's own runner is passed in (`hydra_entry(cfg, run, summarize)`): the harness never imports
an experiment.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from experiments.harness.points import CONF_DIR
from experiments.harness.sweeps import check_sweep


def load_config(config_name: str = "kernel_decode", overrides=(), return_hydra_config: bool = False):
    """Compose conf/<config_name>.yaml with Hydra's compose API (no Hydra runtime, no output dirs)."""
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR), job_name="replayssm_bench"):
        return compose(config_name=config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


def config_dict(cfg) -> dict:
    """The composed config as a plain, resolved dict without Hydra's own `hydra` node."""
    if isinstance(cfg, dict):
        return {k: v for k, v in cfg.items() if k != "hydra"}
    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("hydra", None)
    return data


def hydra_entry(cfg, run: Callable, summarize: Callable[[list[dict]], str]) -> str:
    """What the kernel entry points run under Hydra: an explicit `model=...` on the command line narrows a
    sweep that lists its own models to that model; then `run(cfg)` (a result with rows, run_dir,
    resumed_skipped and env: experiments.kernel.run.RunResult), print `summarize(rows)`, return the run
    directory."""
    task = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    if cfg.sweep.get("models") is not None and any(o.startswith("model=") for o in task) \
            and not any(o.startswith("sweep.models=") for o in task):
        with open_dict(cfg):
            cfg.sweep.models = None
            if cfg.sweep.get("on_cpu") and "models" in cfg.sweep.on_cpu:
                del cfg.sweep.on_cpu["models"]        # the explicit model wins on a CPU too
    check_sweep(cfg.experiment.name)
    keep_user_overrides(cfg, task)
    t0 = time.perf_counter()
    result = run(cfg)
    elapsed = time.perf_counter() - t0
    print(summarize(result.rows))
    extra = f" ({result.resumed_skipped} points already done)" if result.resumed_skipped else ""
    print(f"{cfg.experiment.name}: {len(result.rows)} rows in {elapsed:.1f} s{extra} -> {result.run_dir}")
    exit_if_nothing_measured(result.rows, cfg.experiment.name, result.run_dir)
    host = result.env.get("host_per_point_s") if result.env else None
    if host:
        print(f"host per timed point (median of {host['points']}): gate {host['gate_s']:.3f} s + build "
              f"{host['build_s']:.3f} s + capture {host['capture_s']:.3f} s = {host['host_s']:.3f} s; whole timing "
              f"call {host['timing_s']:.3f} s (host_costs.csv)")
    return str(result.run_dir)


def keep_user_overrides(cfg, overrides: list[str]) -> list[str]:
    """A sweep key the user typed (`sweep.batch=[2]`) wins over the sweep's `on_cpu` block, which would
    otherwise replace it on a CPU: the key is taken out of `on_cpu`, so the typed value is applied (and
    validated like any other: a bad one is refused). Returns the keys taken out."""
    on_cpu = cfg.sweep.get("on_cpu")
    if not on_cpu:
        return []
    typed = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    taken = [k for k in list(on_cpu) if f"sweep.{k}" in typed]
    with open_dict(cfg):
        for k in taken:
            del cfg.sweep.on_cpu[k]
    return taken


def exit_if_nothing_measured(rows: list[dict], experiment: str, run_dir) -> None:
    """A run in which every point it ran failed (error / oom / wrong) exits non-zero with one line saying
    so; rows are kept on disk. Skipped points (a method unavailable here) are not failures."""
    failed = [r for r in rows if r.get("status") in ("error", "oom", "wrong")]
    if rows and len(failed) == len(rows):
        counts: dict[str, int] = {}
        for r in failed:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        first = str(failed[0].get("message") or "")[:200]
        raise SystemExit(f"{experiment}: every one of the {len(rows)} points failed "
                         f"({', '.join(f'{k}={v}' for k, v in sorted(counts.items()))}); first: {first} "
                         f"(rows kept in {run_dir})")
