"""A pytest plugin for scripts/gpu/gpu_check.sh (`-p gpu_check_testlog`, scripts/gpu/ on PYTHONPATH): a per-test record
that survives a kill, and a time bound on the session.

GPU_CHECK_TEST_LOG=<file>: one line when a test starts (`<nodeid>\tstarted`) and one when it ends
(`<nodeid>\t<passed|failed|skipped>\t<seconds>`), each written and flushed at once, so a stage killed at its
limit still says which tests passed and which one was running. (pytest's --junitxml is written only at the
end of the session.)
GPU_CHECK_TEST_BUDGET_S=<seconds>: no test starts after that many seconds, counted from the unix time
GPU_CHECK_TEST_T0 (the stage's start, so imports and collection count) or else from the first test's start;
the session ends normally (its junit XML written) and the log says how many tests were not started.
Exit status when the budget stopped the session: BUDGET_EXIT (10) when no test failed (gpu_check.sh records the
stage as `budget: N not started`, not as a failure), 1 when one did; pytest's own would be 2 (interrupted) in
both cases, which reads like a crash.
"""

from __future__ import annotations

import os
import time

import pytest

BUDGET_EXIT = 10                  # gpu_check.sh: the budget ran out, nothing failed (its run_stage reads it)
_BUDGET_HIT = False
_T0: float | None = float(os.environ["GPU_CHECK_TEST_T0"]) if os.environ.get("GPU_CHECK_TEST_T0") else None


def _log(line: str) -> None:
    path = os.environ.get("GPU_CHECK_TEST_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()


def pytest_runtest_logstart(nodeid, location):
    global _T0
    if _T0 is None:
        _T0 = time.time()
    _log(f"{nodeid}\tstarted")


def pytest_runtest_logreport(report):
    # one end line per test: its call, or the setup that skipped / failed it, or a failing teardown
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed") or \
            (report.when == "teardown" and report.outcome == "failed"):
        _log(f"{report.nodeid}\t{report.outcome}\t{report.duration:.2f}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    global _BUDGET_HIT
    budget = os.environ.get("GPU_CHECK_TEST_BUDGET_S")
    if budget and _T0 is not None and time.time() - _T0 > float(budget):
        _BUDGET_HIT = True
        session = item.session
        if not session.shouldstop:
            left = len(session.items) - session.items.index(item)
            _log(f"# time budget {budget} s spent: {left} tests not started")
            session.shouldstop = f"gpu_check: test time budget ({budget} s) spent"
        return True                                  # handled: the test is not run
    return None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    # pytest returns session.exitstatus after this hook: a budget stop is not an interruption
    if _BUDGET_HIT:
        session.exitstatus = 1 if session.testsfailed else BUDGET_EXIT
