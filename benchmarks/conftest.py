"""make bench-cpu: the per-method table printed after the pytest-benchmark timings.

Per thread count and family: ms/step, GB/s (byte model / time), % of the copy plateau measured by the cold
probe at that thread count (experiments/harness/bandwidth.py, cached per machine), speedup over the partner
method (rows of this session), the byte model's ratio for the same pair, and speedup / byte model; then the
machine's roofline (replayssm/cpu/roofline.py: read, in-place update and FMA rates measured at that thread
count): each method's floor in ms/step, the share of it reached (roof / measured), and the ratio the
roofline predicts for the pair, the bound a CPU can show where the byte model is the GPU's; and the paired
speedup (test_paired: the method's cycles alternating with its partner's, median of the per-round ratios).
"""

from __future__ import annotations

RESULTS: dict[tuple, dict] = {}


PLATEAU: dict[int, float | None] = {}
ROOF: dict[int, dict | None] = {}


def roof(threads: int) -> dict | None:
    """This machine's roofline rates at `threads` (replayssm/cpu/roofline.py), measured once per session."""
    if threads not in ROOF:
        try:
            from replayssm.cpu.roofline import measure

            ROOF[threads] = measure(threads)
        except Exception:  # noqa: BLE001 - no compiler: the table prints without the roofline columns
            ROOF[threads] = None
    return ROOF[threads]


def plateau(threads: int) -> float | None:
    """The copy plateau at `threads`, probed afresh once per session (before that thread count's first
    timing, so it sees the machine as the timings do) and refreshing the per-machine cache."""
    if threads not in PLATEAU:
        import torch

        before = torch.get_num_threads()
        try:
            from experiments.harness.bandwidth import cold_point
            from experiments.harness.env import cpu_llc

            PLATEAU[threads] = cold_point(threads, mode="fresh",
                                          llc_bytes=cpu_llc()["llc_bytes"])["plateau_copy_GBps"]
        except Exception:  # noqa: BLE001 - the table still prints, without the % column
            PLATEAU[threads] = None
        finally:
            torch.set_num_threads(before)
    return PLATEAU[threads]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not RESULTS:
        return
    import torch

    from experiments.harness.env import cpu_name, short_sha

    tr = terminalreporter
    tr.section("ReplaySSM CPU benchmark: per method (batch 32, fp32, L = 16, T = 4, B = 16)")
    tr.write_line(f"{cpu_name()}, torch {torch.__version__}, commit {short_sha()}")
    for threads in sorted({k[0] for k in RESULTS}):
        plat = plateau(threads)
        tr.write_line("")
        rates = roof(threads)
        tr.write_line(f"threads {threads}; copy plateau "
                      + (f"{plat:.1f} GB/s (measured by the cold probe this session)" if plat else "unknown")
                      + ("; roofline: read {read_GBps:.1f} GB/s, in-place update {update_GBps:.1f} GB/s, "
                         "{flop_GFLOPs:.0f} GFLOP/s".format(**rates) if rates else ""))
        tr.write_line(f"{'family':7} {'method':34} {'backend':7} {'ms/step':>9} {'GB/s':>7} {'%plat':>6} "
                      f"{'speedup':>8} {'bytes':>7} {'sp/bytes':>8} {'roof ms':>8} {'%roof':>6} {'roof x':>7} "
                      f"{'paired':>7}")
        for (t, family, label), r in RESULTS.items():
            if t != threads:
                continue
            gbps = r["bytes"] / (r["ms"] * 1e-3) / 1e9
            pct = f"{100 * gbps / plat:6.0f}" if plat else f"{'-':>6}"
            part = RESULTS.get((t, family, r["partner"])) if r["partner"] else None
            if part is not None:
                speed, model = part["ms"] / r["ms"], part["bytes"] / r["bytes"]
                tail = f"{speed:7.2f}x {model:6.2f}x {speed / model:8.2f}"
            else:
                tail = f"{'-':>8} {'-':>7} {'-':>8}"
            if r.get("roof_ms"):
                rx = (f"{part['roof_ms'] / r['roof_ms']:6.2f}x" if part is not None and part.get("roof_ms")
                      else f"{'-':>7}")
                tail += f" {r['roof_ms']:8.2f} {100 * r['roof_ms'] / r['ms']:6.0f} {rx}"
            if r.get("paired"):
                tail += f" {r['paired']:6.2f}x"
            tr.write_line(f"{family:7} {label:34} {r['backend']:7} {r['ms']:9.2f} {gbps:7.1f} {pct} {tail}")
    tr.write_line("speedup = partner ms / method ms (replay_ar vs baseline_ar; spec methods vs baseline_spec); "
                  "bytes = the byte model's ratio for the same pair; roof ms = the roofline's floor per step, "
                  "%roof = roof / measured, roof x = the roofline's ratio for the pair; paired = the median "
                  "speedup over cycles alternating with the partner's (test_paired)")
