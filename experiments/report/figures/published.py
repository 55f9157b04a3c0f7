"""Published values drawn as reference markers by experiments/report/figures/paper.py (never measurements of ours).

Each value is copied from its source, with the hardware and conditions the source states:
- the ReplaySSM blog post (Liou and Dao, 2026): https://dao-lab.ai/blog/2026/replayssm/ (markdown source
  `Dao-AILab/dao-ailab.github.io`, `_posts/2026-06-15-replayssm.md`), Figures 6-11. Its setup table: Nemotron-3-Nano-4B
  and Qwen3.5-4B in BF16 on 1x H100; Nemotron-3-Super-120B-A12B and Qwen3.5-122B-A10B in NVFP4 on 1x B300;
  Nemotron-3-Ultra-550B in NVFP4 on 2x B300 (TP2).
- vLLM pull requests and RFC of the authors (github.com/vllm-project/vllm): PR #47576 (ReplaySSM spec draft:
  max decode concurrency at B = 16, T = 4, max_model_len 2048, 1x B300), PR #49887 (GDN spec on Qwen3.5-122B;
  the hardware is not stated in the retrieved table and is taken to be the blog's B300 NVFP4 setup).

A `lo`/`hi` pair is a published range (drawn as a vertical bar); `value` alone a point (a star).
"""

from __future__ import annotations

from dataclasses import dataclass

BLOG = "ReplaySSM blog (Liou and Dao, 2026)"


@dataclass(frozen=True)
class Reference:
    figure: str                 # "fig6" ... "fig11"
    label: str                  # legend text
    hardware: str
    source: str
    family: str | None = None   # "mamba2" | "gdn" | None
    model: str | None = None    # a model name of conf/model, when the value is for one model
    x: float | str | None = None    # where on the x axis (batch, L, T, level name, mode)
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    note: str = ""


REFERENCES: tuple[Reference, ...] = (
    # Fig 6 / §6.1: kernel speedup at batch 256, 1K decoding steps, buffer 8 (Nemotron-3) / 16 (Qwen3.5);
    # a range over each family's models (per-model bars are not given in the text).
    Reference("fig6", "Nemotron-3, published range", "H100 / B300", f"{BLOG}, Fig. 6", family="mamba2",
              lo=1.43, hi=1.84, note="batch 256, buffer 8, over the family's models"),
    Reference("fig6", "Qwen3.5, published range", "H100 / B300", f"{BLOG}, Fig. 6", family="gdn",
              lo=1.43, hi=1.64, note="batch 256, buffer 16, over the family's models"),
    # Fig 7: the bell curve's peak (no per-L values in the text): best buffer length per family.
    Reference("fig7", "Nemotron-3 published best L", "H100 / B300", f"{BLOG}, Fig. 7", family="mamba2", x=8,
              note="batch 64 and 256"),
    Reference("fig7", "Qwen3.5 published best L", "H100 / B300", f"{BLOG}, Fig. 7", family="gdn", x=16,
              note="batch 64 and 256"),
    # Fig 8 as throughput over standard decoding (T = 4): PR #49887's "vs no-spec" column for ReplaySSM spec;
    # native spec = (vs no-spec) / (vs native), computed from the PR's two tables.
    *(Reference("fig8", "ReplaySSM spec, Qwen3.5-122B (PR #49887)", "B300 (taken as the blog's setup)",
                "vLLM PR #49887, T = 4", family="gdn", model="qwen35_122b_a10b", x=b, value=v)
      for b, v in ((1, 1.97), (32, 2.08), (128, 1.87), (256, 1.84), (512, 1.90))),
    *(Reference("fig8", "Native spec, Qwen3.5-122B (PR #49887)", "B300 (taken as the blog's setup)",
                "vLLM PR #49887, T = 4 (vs no-spec / vs native)", family="gdn", model="qwen35_122b_a10b", x=b,
                value=round(a / n, 2))
      for b, a, n in ((1, 1.97, 1.12), (32, 2.08, 1.22), (128, 1.87, 1.43), (256, 1.84, 1.79), (512, 1.90, 2.10))),
    Reference("fig8", "ReplaySSM spec, published range", "B300, NVFP4", f"{BLOG}, Fig. 8", lo=1.87, hi=1.96,
              note="over standard decoding at serving batch sizes, GSM8K, T = 4, MTP drafter"),
    # Fig 9: cost of one spec kernel step relative to a standard decode step, Qwen3.5-122B-A10B-NVFP4, batch
    # 128, buffer 16, 1x B300, T = 6.
    Reference("fig9", "Native spec, published", "B300", f"{BLOG}, Fig. 9", family="gdn", x=6, value=4.85,
              note="Qwen3.5-122B, batch 128"),
    Reference("fig9", "ReplaySSM spec, published (all-reject to all-accept)", "B300", f"{BLOG}, Fig. 9",
              family="gdn", x=6, lo=1.27, hi=1.72, note="Qwen3.5-122B, batch 128, buffer 16"),
    # Fig 10: ReplaySSM spec over vLLM's spec baseline at three levels, window 4.
    Reference("fig10", "published range", "B300", f"{BLOG}, Fig. 10", x="kernel", lo=2.28, hi=3.33),
    Reference("fig10", "published range", "B300", f"{BLOG}, Fig. 10", x="verify forward", lo=1.23, hi=1.69),
    Reference("fig10", "published range", "B300", f"{BLOG}, Fig. 10", x="whole step", lo=1.20, hi=1.58),
    # Fig 11: max concurrency, ReplaySSM spec over native spec, fixed HBM budget, window 4.
    Reference("fig11", "published range", "B300", f"{BLOG}, Fig. 11", lo=3.0, hi=3.3),
    Reference("fig11", "Nemotron-3-Super-120B: 694 vs 213", "B300, max_model_len 2048", "vLLM PR #47576",
              model="nemotron3_super_120b", value=3.25),
    Reference("fig11", "Qwen3.5-122B: 702 vs 233", "B300, max_model_len 2048", "vLLM PR #47576",
              model="qwen35_122b_a10b", value=3.01),
)


def references(figure: str) -> list[Reference]:
    return [r for r in REFERENCES if r.figure == figure]
