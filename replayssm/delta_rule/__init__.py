"""Triton kernels of the gated delta rule's AR decode, one module per phase (shared-docs structure-review §4.1):

    _tl.py       @triton.jit helpers: the replay weights of a buffer and the split dots of the fold
    ar_prep.py   grid (batch, H): per (row, key head) everything that does not depend on the value tile
    ar_step.py   grid (V tiles, batch, HV): the readout of every step, flush rows included; no family flag
    ar_fold.py   grid (V tiles, batch, HV): the flush, a K-chunked fold of the whole buffer into the checkpoint
    launch.py    launch configs (default rules through replayssm/launch_table.py), workspace, the launcher

They compute the "output_only_fold" route of replayssm.gdn.replay_step (replayssm/checks.py ROUTES). GDN only so
far: KDA keeps the routes of replayssm/gdn/decode_kernels.py; its per-channel work belongs in a prep kernel
of its own (issue 34 item 2), the main step and the fold stay as they are.

AOT at Qwen3.5-122B (K = V = 128, H 16, HV 64), L = 16, fp32 state, bf16 activations, sm_90, b256
(`make kernel-report`, scripts/kernels/kernel_report.py --method "gdn.replay[output_only_fold]"), Triton 3.7.1 / 3.6.0:
    shipped step (output_only)  125 / 163 regs, 4 / 3 blocks (16 / 12 warps) per SM, 1,883 / 1,998 SASS
                                (SHFL 165, BAR 64, HMMA 48, MUFU 7), issue floor 502 / 727 us
    ar_step_kernel              48 / 48 regs, 10 blocks (40 warps), 4 KB smem, 627 / 626 SASS (SHFL 52, BAR 13,
                                no HMMA, no MUFU), issue floor 206 us (every step)
    ar_prep_kernel              48 / 40 regs, 594 / 645 SASS, grid (256, 16): ~12 us
    ar_fold_kernel              48 / 48 regs, 10 blocks, 7 KB smem, 576 SASS (HMMA 32: bf16x2), ~185 us on a flush
                                step, an early exit (2 loads) on the other L-1
No spill at Qwen3.5-122B, Qwen3.5-4B, Qwen3-Next-80B, fp32 and fp16 state, sm_90 and sm_100, under both Tritons.
The report's step row sums the fold's full path into every step (403 us); its cycle mean is ~12 + 206 + 185/16
+ early exits ~ 235 us against 288.5 us of bytes (0.81x). The report does not map this recipe to a byte model
yet (experiments/report/kernels/predict.py METHOD_OF has no "replay[output_only_fold]" entry).

GPU check (prepared, not run: no GPU in the session that wrote this route). On the H200, at Qwen3.5-122B b256
L = 16, fp32 state, bf16 activations, tuned baseline beside it:

    python -m experiments.kernel_decode sweep=gpu_route "sweep.routes=[output_only_fold,output_only]"

What it should show: the output_only_fold row's median_us at or under ~0.6x output_only's (issue floor 0.47x of
the shipped step's under 3.6.0's registers), i.e. near the byte time (~315 us of a 4.1 TB/s copy, plus three
launches of ~2-3 us), and a flush_us about one normal step plus a state write (the fold rewrites the
checkpoint: +4 MB per row over the batch's flushing rows). ncu on ar_step_kernel: 48 registers, 62.5 %
theoretical occupancy, DRAM near the byte model; on ar_fold_kernel: non-flush rows exit in < 1 us of grid.
If the route wins, switch the GDN default (replayssm/gdn/decode.py route=) on that measurement, and tune
gdn_replay_ar_step (BV 16/32/64, 2/4 warps) and gdn_replay_ar_fold through replayssm/launch_table.py.
"""
