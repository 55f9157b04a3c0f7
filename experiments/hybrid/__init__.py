"""A hybrid (SSM + attention + MLP/MoE) model's decode step at a production model's dimensions, random weights.

    spec.py       HybridSpec: conf/model -> layer pattern, per-rank dims, composition (the block that is built)
    layers.py     the layers as engines run them: SSM mixer (in_proj, conv1d state update, the SSM method under
                  test through the harness registry, gated RMSNorm, out_proj), attention over a KV cache with a
                  length cursor, dense MLP, MoE (grouped GEMM when torch has it)
    model.py      HybridModel: embedding -> layers -> final norm -> LM head; decode / verify / commit / draft,
                  per-layer-kind timers (the SSM share of the step)
    footprint.py  analytic bytes (weights incl. NVFP4, KV cache, SSM caches, buffers/rings), max concurrency (plain
                  and vLLM's hybrid allocator; CLI: the paper's concurrency table), a step's analytic bytes
    sweep.py      e2e_decode / serving config validation and points (ValueError before any work), the SSM stack
                  of a composed block and its cache residency, row store
    run.py        the timing cores: whole cycles, per-phase (verify / commit) and per-kind profiles, rows

The layers are workload; the SSM decode methods stay in replayssm/ and baselines/ and are reached through
experiments/harness/methods.py (REGISTRY), so swapping the SSM method changes nothing else in the step.
"""
