"""A `vllm serve` process the harness starts and always stops: loopback only, log captured, readiness by
polling /health.

    with EngineServer(argv, port=port, log_path=run_dir / "server.log", ready_timeout_s=900) as server:
        ... run `vllm bench serve` against 127.0.0.1:port ...

The server runs in its own process group (start_new_session), so stopping it also stops the engine's
worker processes: SIGTERM to the group, then SIGKILL after `stop_grace_s`. It is stopped on every way out of
the `with` block: success, an exception, a readiness timeout, KeyboardInterrupt.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class ServerError(RuntimeError):
    """The server exited or did not become ready in time (it has been stopped when this is raised)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on loopback right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def require_loopback(argv: list[str]) -> None:
    """ValueError unless argv binds the server to loopback (`--host 127.0.0.1`): the benchmark server must
    never listen on a public interface."""
    if "--host" not in argv or argv.index("--host") + 1 >= len(argv):
        raise ValueError("server argv has no --host: pass --host 127.0.0.1 (loopback only)")
    host = argv[argv.index("--host") + 1]
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"server --host {host!r} is not loopback; only {LOOPBACK_HOSTS} are allowed")


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class EngineServer:
    """Context manager around one server process (see the module docstring)."""

    def __init__(self, argv: list[str], *, port: int, log_path: Path, ready_timeout_s: float,
                 poll_s: float = 0.5, stop_grace_s: float = 20.0, env: dict | None = None):
        require_loopback(argv)
        if ready_timeout_s <= 0:
            raise ValueError(f"ready_timeout_s must be > 0, got {ready_timeout_s}")
        self.argv, self.port, self.log_path = list(argv), int(port), Path(log_path)
        self.ready_timeout_s, self.poll_s, self.stop_grace_s = float(ready_timeout_s), poll_s, stop_grace_s
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health"

    def __enter__(self) -> EngineServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=self.env)
        finally:
            log.close()                              # the child holds its own descriptor
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        t0 = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(f"server exited with code {code} before becoming ready; log {self.log_path}:\n"
                                  f"{tail(self.log_path)}")
            if self._healthy():
                self.ready_s = time.monotonic() - t0
                return
            if time.monotonic() - t0 > self.ready_timeout_s:
                raise ServerError(f"server not ready after {self.ready_timeout_s:g} s ({self.health_url} never "
                                  f"answered 200); stopped it; log {self.log_path}:\n{tail(self.log_path)}")
            time.sleep(self.poll_s)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period; reaps the process. Idempotent."""
        proc = self.proc
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, self.stop_grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)             # pid == pgid: the server leads its own session
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:
            proc.wait(timeout=10)
        try:                                         # stragglers of the group (engine workers) after the leader
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc = None
