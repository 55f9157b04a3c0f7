"""Real-engine rows: drive the installed vLLM's own benchmark CLI with and without ReplaySSM.

    dialect.py   which ReplaySSM flags the installed engine has (from its --help text), its version
    commands.py  argv of `vllm serve`, `vllm bench serve` and `vllm bench throughput` per mode (pure)
    results.py   vLLM's result JSON (real schema), its stdout summary and the server log -> metrics (pure)
    server.py    a `vllm serve` process on loopback: readiness, log capture, always stopped
    plan.py      config schema and expansion into engine points (model x mode x bench x max-num-seqs)
    run.py       run_engine_bench(cfg): points -> rows (level=engine) in the harness's run store

The harness never re-implements a serving engine: every number comes from vLLM's own benchmark output.
"""
