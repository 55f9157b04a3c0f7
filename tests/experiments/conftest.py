"""Fixtures for the harness tests (helpers and test doubles live in harness_doubles.py)."""

from __future__ import annotations

import pytest
from harness_doubles import OOMBaseline, RaisingBaseline, WrongBaseline

from experiments.harness import methods


@pytest.fixture
def doubles():
    """Register the test-double methods for one test only."""
    added = [methods.register(cls()) for cls in (WrongBaseline, RaisingBaseline, OOMBaseline)]
    yield [m.name for m in added]
    for m in added:
        methods.unregister(m.name)
