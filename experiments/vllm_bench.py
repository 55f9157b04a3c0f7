"""Real-engine rows: the installed vLLM's own benchmarks per model x mode, with and without ReplaySSM.

    python -m experiments.vllm_bench model=qwen35_4b                         # paper sweep of one model
    python -m experiments.vllm_bench engine_sweep=vllm_smoke model=nemotron3_nano_4b
    python -m experiments.vllm_bench --multirun model=qwen35_4b,nemotron3_nano_4b

Modes: standard, native_spec (MTP, T=4), replayssm_ar, replayssm_spec; benches: `vllm bench throughput`
(offline) and `vllm bench serve` against a `vllm serve` started and stopped here on 127.0.0.1. Without an
engine or a GPU every point is recorded status=skipped with the reason and the exact commands.
The work is `experiments.vllm.run.run_engine_bench(cfg)`, a plain function; Hydra only composes cfg.
"""

import time

import hydra

import experiments.vllm.plan  # noqa: F401 - registers the engine / engine_sweep schemas before composing
from experiments.vllm.run import run_engine_bench, summarize


@hydra.main(version_base="1.3", config_path="../conf", config_name="vllm_bench")
def main(cfg) -> str:
    t0 = time.perf_counter()
    result = run_engine_bench(cfg)
    print(summarize(result.rows))
    engine = result.engine
    print(f"engine: {engine['executable'] or 'not found'} version={engine['version']} dialect={engine['dialect']}"
          + (f" (read from `{engine['help_source']}`)" if engine["help_source"] else ""))
    extra = f" ({result.resumed_skipped} points already done)" if result.resumed_skipped else ""
    print(f"vllm_bench: {len(result.rows)} rows in {time.perf_counter() - t0:.1f} s{extra} -> {result.run_dir}")
    return str(result.run_dir)


if __name__ == "__main__":
    main()
