"""Fixtures of the engine tests: a fake `vllm` executable (fake_vllm.py) in a temp dir, and engine points."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """Path of a `vllm` executable that runs fake_vllm.py; its state dir is tmp_path/state."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vllm"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "fake_vllm.py"}" "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_VLLM_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); it is gone for our purposes once reaped or a zombie
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
