"""Triton kernels of the delta-rule families' AR decode (GDN and KDA), one module per phase (shared-docs
structure-review §4.1):

    _tl.py       @triton.jit helpers: the replay weights of a buffer and the split dots of the fold
    ar_prep.py   per row: everything that does not depend on the value tile. GDN's ar_prep_kernel per key head,
                 KDA's ar_prep_channel_kernel per value head (its decays differ per key channel and value head)
    ar_step.py   grid (V tiles, batch, HV): the readout of every step, flush rows included; no family flag
    ar_fold.py   grid (V tiles, batch, HV): the flush, a K-chunked fold of the whole buffer into the checkpoint;
                 no family flag (the decays are read at a stride along K: 1 for KDA, 0 for GDN)
    launch.py    launch configs (default rules through replayssm/launch_table.py), workspace, the launcher

They compute the "output_only_fold" route of replayssm.gdn.replay_step and replayssm.kda.replay_step
(replayssm/checks.py ROUTES); the ring verify's phases live beside them (spec_*.py).

AOT, sm_90, b256, L = 16, fp32 state, bf16 activations, q / k normalised (`make kernel-report`, the step rows of
scripts/kernels/kernel_report.py --method "gdn.replay[output_only_fold]" --method "kda.replay[output_only_fold]"),
Triton 3.7.1 (3.6.0 within 1 %): issue floor, cycle mean over L steps, against the byte model's time at 4.146 TB/s:
    Qwen3.5-122B (GDN)   shipped output_only  510.7 us  vs 288.5 us of bytes (1.77x)
                         output_only_fold     161.8 us  (0.56x): prep 10.0 + step 146.6 + fold 79.6 / 16
    Kimi-Linear (KDA)    shipped output_only  480.4 us  vs 157.7 us (3.05x)
                         output_only_fold     105.9 us  (0.67x): prep 29.9 + step 73.3 + fold 40.6 / 16
Registers: step 70 (7 blocks, 28 warps per SM), fold 72-80, GDN prep 32, KDA prep 128 (one warp, 16 warps per
SM). No spill at Qwen3.5-122B, Qwen3.5-4B, Qwen3-Next-80B, Kimi-Linear, fp32 and fp16 state, sm_90 and sm_100,
under both Tritons.

GPU check (prepared, not run: no GPU in the sessions that wrote this route). On the H200, b256 / 512, L = 16,
fp32 state, bf16 activations, tuned baseline beside it:

    python -m experiments.kernel_decode sweep=gpu_route "sweep.routes=[output_only_fold,output_only]"

What it should show: output_only_fold's median_us near the byte time (~315 / ~170 us at b256 for Qwen3.5-122B /
Kimi-Linear on a 4.1 TB/s copy, plus four launches of ~2-3 us), against output_only's issue-bound ~500 us, and a
flush_us of about one normal step plus a state write. If it wins, switch the GDN / KDA default
(replay_step's route=) on that measurement, and tune the *_replay_ar_{step,fold} entries (replayssm/launch_table.py).
"""
