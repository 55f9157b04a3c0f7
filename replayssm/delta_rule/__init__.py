"""Triton kernels of the gated delta rule's AR decode, one module per phase (shared-docs structure-review §4.1):

    _tl.py       @triton.jit helpers: the replay weights of a buffer and the split dots of the fold
    ar_prep.py   grid (batch, H): per (row, key head) everything that does not depend on the value tile
    ar_step.py   grid (V tiles, batch, HV): the readout of every step, flush rows included; no family flag
    ar_fold.py   grid (V tiles, batch, HV): the flush, a K-chunked fold of the whole buffer into the checkpoint
    launch.py    launch configs (default rules through replayssm/launch_table.py), workspace, the launcher

They compute the "output_only_fold" route of replayssm.gdn.replay_step (replayssm/checks.py ROUTES). GDN only so
far: KDA keeps the routes of replayssm/gdn/decode_kernels.py; its per-channel work belongs in a prep kernel
of its own (issue 34 item 2), the main step and the fold stay as they are.
"""
