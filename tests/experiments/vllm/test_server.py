"""The server process manager: readiness timeout, crash, Ctrl-C, loopback only; the server is always stopped."""

from __future__ import annotations

import json
import time

import pytest
from conftest import pid_alive

from experiments.vllm.server import EngineServer, ServerError, free_port, require_loopback


def _argv(exe, port, host="127.0.0.1"):
    return [str(exe), "serve", "org/M", "--host", host, "--port", str(port), "--max-num-seqs", "4",
            "--max-model-len", "2048"]


def _server_pids(tmp_path) -> list[int]:
    for _ in range(50):                                 # the fake records its pid on start
        path = tmp_path / "state" / "pids"
        if path.exists():
            return [json.loads(line)["pid"] for line in path.read_text().splitlines()]
        time.sleep(0.05)
    return []


def _gone(pids) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_never_ready_times_out_with_a_clear_message_and_is_stopped(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_SERVE", "never_ready")
    port = free_port()
    server = EngineServer(_argv(fake_vllm, port), port=port, log_path=tmp_path / "server.log", ready_timeout_s=1.0,
                          poll_s=0.1, stop_grace_s=2)
    with pytest.raises(ServerError, match=r"not ready after 1 s .*/health.*stopped it"):
        with server:
            pytest.fail("the body must not run")
    pids = _server_pids(tmp_path)
    assert pids and _gone(pids) and server.proc is None
    assert "vLLM API server version" in (tmp_path / "server.log").read_text()


def test_crash_before_ready_reports_the_exit_code_and_log(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_SERVE", "crash")
    port = free_port()
    with pytest.raises(ServerError, match=r"exited with code 1(.|\n)*no kernel image"):
        with EngineServer(_argv(fake_vllm, port), port=port, log_path=tmp_path / "s.log", ready_timeout_s=20,
                          poll_s=0.1):
            pass


def test_ready_then_ctrl_c_stops_the_server(fake_vllm, tmp_path):
    port = free_port()
    server = EngineServer(_argv(fake_vllm, port), port=port, log_path=tmp_path / "s.log", ready_timeout_s=30,
                          poll_s=0.1, stop_grace_s=5)
    with pytest.raises(KeyboardInterrupt):
        with server:
            assert server.ready_s is not None and server._healthy()
            raise KeyboardInterrupt
    pids = _server_pids(tmp_path)
    assert pids and _gone(pids) and not server._healthy()


def test_success_path_stops_too(fake_vllm, tmp_path):
    port = free_port()
    with EngineServer(_argv(fake_vllm, port), port=port, log_path=tmp_path / "s.log", ready_timeout_s=30,
                      poll_s=0.1) as server:
        assert server._healthy()
    assert _gone(_server_pids(tmp_path))
    assert "Maximum concurrency" in (tmp_path / "s.log").read_text()


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", None])
def test_loopback_only(fake_vllm, tmp_path, host):
    argv = _argv(fake_vllm, 1) if host is None else _argv(fake_vllm, 1, host)
    if host is None:
        i = argv.index("--host")
        del argv[i:i + 2]
    with pytest.raises(ValueError, match="loopback|--host"):
        EngineServer(argv, port=1, log_path=tmp_path / "s.log", ready_timeout_s=1)
    assert not (tmp_path / "state" / "pids").exists()      # refused before any process started
    require_loopback(_argv(fake_vllm, 1))


def test_a_benchmark_past_its_timeout_is_killed_with_its_group(tmp_path):
    """run.py's benchmark runner: timeout -> BenchError naming it, and the process group is gone."""
    from experiments.vllm.run import BenchError, _run_logged

    script = tmp_path / "slow.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nsleep 30 &\necho $! >> {tmp_path / 'pid'}\nwait\n")
    script.chmod(0o755)
    with pytest.raises(BenchError, match="ran past 1 s; killed"):
        _run_logged([str(script), "bench", "serve"], tmp_path / "bench.log", timeout_s=1)
    pids = [int(p) for p in (tmp_path / "pid").read_text().split()]
    assert len(pids) == 2 and _gone(pids)
    with pytest.raises(BenchError, match="exited with code 3"):
        _run_logged(["sh", "-c", "echo boom; exit 3"], tmp_path / "b2.log", timeout_s=10)
    assert "boom" in (tmp_path / "b2.log").read_text()
