"""The report library: a run directory's rows -> ratios, tables, figures and the claims report.

    runs        load a run (rows.csv, env.json), pair rows into ratios (summary.csv, counts.csv)
    engine      the real-engine rows (vllm_bench) and their ratios
    hybrid      the whole-model rows (e2e_decode, serving) and their ratios
    accuracy    the accuracy study's tables and verdicts (accuracy.csv)
    tables      TABLES.md;  claims: REPORT.md against experiments/published.py
    record      the published record: record_cells (cells, published_vs_run.csv), record_model (the per-step
                time model at a cell), record_loses ("Where ReplaySSM loses"); claims.py appends both sections
    figures/    style, plots (every figure), paper (the blog's Figs. 6-11), hybrid, tree, published markers,
                record (one figure per published table: cells, model, measured)
    kernels/    ahead-of-time kernel build (aot, recipes, cubin), counted traffic, DRAM counters

The command lines are scripts/report/*.py and scripts/kernels/*.py (scripts/README.md). Imports nothing here.
"""
