"""Test set-up: Triton runs in the CPU interpreter; every test draws fresh random inputs.

Each session draws a new seed; set REPLAYSSM_TEST_SEED=<n> to replay a failure. The seed is printed where a
`-q` run under xdist shows it: the terminal summary's last lines, and the message of every failing test. Every
random draw in a test derives from it and the test's id (the `gen` fixture, and the global torch / random /
numpy generators, reseeded before each test), so a replay draws the same inputs whatever ran before it or on
which worker. `make test-seeds N=5` runs the suite under N fresh seeds (scripts/test_seeds.py).
"""

import os
import random
import zlib

import numpy as np

# Must happen before anything imports triton (the interpreter is chosen at import time).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

SESSION_SEED = int(os.environ.get("REPLAYSSM_TEST_SEED", random.SystemRandom().randrange(2**31)))
# pytest-xdist workers inherit the controller's environment: pin the seed there so all workers agree.
os.environ["REPLAYSSM_TEST_SEED"] = str(SESSION_SEED)

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """With the interpreter off (a GPU box: TRITON_INTERPRET=0), run only tests that can use the GPU: those
    marked `gpu` and those that take the `device` fixture (REPLAYSSM_TEST_DEVICE=cuda). The rest drive Triton
    on CPU tensors through the interpreter and belong to `make test`."""
    if os.environ["TRITON_INTERPRET"] not in ("", "0"):
        return
    skip = pytest.mark.skip(reason="CPU-interpreter test: run it with `make test` (TRITON_INTERPRET=1)")
    for item in items:
        if "gpu" not in item.keywords and "device" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


SEED_LINE = f"REPLAYSSM_TEST_SEED={SESSION_SEED}"
REPLAY_HINT = f"replay: {SEED_LINE} make test"


def seed_of(nodeid: str) -> int:
    """The seed of one test: the session seed and the test id, so a test draws the same inputs on any worker."""
    return (SESSION_SEED + zlib.crc32(nodeid.encode())) % 2**32


def pytest_report_header(config):
    return f"replayssm: {SEED_LINE} TRITON_INTERPRET={os.environ['TRITON_INTERPRET']}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The seed on the last lines of every run: `-q` hides the header, and xdist workers print nothing."""
    failed = bool(terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"))
    terminalreporter.write_line(f"replayssm: {SEED_LINE}" + (f" ({REPLAY_HINT})" if failed else ""),
                                red=failed, bold=failed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test names the seed in its own message (the short summary's FAILED line, where it comes
    first because pytest cuts that line to the terminal width) and in a section of its report; both travel
    from an xdist worker to the controller."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    report.sections.append(("replayssm seed", f"{SEED_LINE} (test seed {seed_of(item.nodeid)}); {REPLAY_HINT}"))
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and SEED_LINE not in crash.message:
        crash.message = f"[{SEED_LINE}] {crash.message}"          # first: the summary line is cut to width


@pytest.fixture
def device() -> str:
    """Tests run on CPU (interpreter) unless REPLAYSSM_TEST_DEVICE=cuda is set on a GPU box."""
    dev = os.environ.get("REPLAYSSM_TEST_DEVICE", "cpu")
    if dev == "cpu" and os.environ["TRITON_INTERPRET"] in ("", "0"):
        pytest.skip("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1); set REPLAYSSM_TEST_DEVICE=cuda")
    return dev


@pytest.fixture
def gen(request) -> torch.Generator:
    """A fresh generator per test, seeded from the session seed and the test id."""
    return torch.Generator().manual_seed(seed_of(request.node.nodeid))


@pytest.fixture
def rng(request) -> random.Random:
    """A Python generator for tests that draw plain numbers, seeded like `gen`."""
    return random.Random(seed_of(request.node.nodeid))


@pytest.fixture(autouse=True)
def _seed_global_generators(request):
    """Reseed the global generators before every test: a draw without `gen` (torch.randn(...), random.Random()
    seeded from `random`, numpy) is then fresh per session and replayable from the printed seed, and does not
    depend on which tests ran before it on the same worker."""
    seed = seed_of(request.node.nodeid)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
