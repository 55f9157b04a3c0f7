"""Test set-up: Triton runs in the CPU interpreter; every test draws fresh random inputs.

Each session draws a new seed (printed in the header); set REPLAYSSM_TEST_SEED=<n> to replay a failure.
"""

import os
import random
import zlib

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


def pytest_report_header(config):
    return f"replayssm: REPLAYSSM_TEST_SEED={SESSION_SEED} TRITON_INTERPRET={os.environ['TRITON_INTERPRET']}"


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
    return torch.Generator().manual_seed(SESSION_SEED + zlib.crc32(request.node.nodeid.encode()))
