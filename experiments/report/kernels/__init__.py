"""Kernel-level reports: aot (capture launches, specialise like the JIT, compile for sm_90 / sm_100) with
recipes (what to build, the table) and cubin (registers, spills, load widths from the binary); traffic (counted
HBM bytes under the interpreter vs the byte model); dram (Nsight Compute DRAM counters vs the byte model)."""
