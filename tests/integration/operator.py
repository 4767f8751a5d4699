"""claimwarden as a separate process against a lab, the way a user runs it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from claimwarden_lab.processes import free_port

from .helpers import stop_process, wait_for

LOG_PATHS: list[Path] = []
"""Every claimwarden log file of this session, in order of creation: the auditor reads what each
test appended to them (tests/integration/auditor.py)."""


def log_paths() -> list[Path]:
    return list(LOG_PATHS)


def fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None


class Operator:
    """Start, stop and SIGKILL one `claimwarden run`, logging to ``log_path``."""

    def __init__(self, kubeconfig: Path, log_path: Path, extra: list[str] | None = None,
                 identity: str | None = None, env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        # The leader election identity (POD_NAME), kept across restarts like a pod's name across
        # container restarts: a restarted leader renews its own lease instead of waiting for it to expire.
        self.identity = identity or f"claimwarden-{uuid.uuid4().hex[:8]}"
        self.log_path = log_path
        if log_path not in LOG_PATHS:
            LOG_PATHS.append(log_path)
        self.extra = extra or []
        self.env = env or {}
        """More environment, as libfaketime's LD_PRELOAD and FAKETIME (a clock running 10 % fast)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.liveness_port = free_port()
        self.metrics_port = free_port()
        self.readiness_port = free_port()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, lead: bool = True) -> None:
        """Start it and wait for its liveness endpoint, and with `lead` until it leads."""
        if self.running:
            return
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(self.kubeconfig),
             "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
             "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
             "--readiness", f"http://127.0.0.1:{self.readiness_port}/readyz",
             # Tests read a gauge right after the change it shows; the 5 s reuse is unit-tested.
             "--metrics-cache-period", "0",
             # Kopf's plain format is the bare message: the auditor needs the level to find ERRORs.
             "--log-format", "full", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env, "POD_NAME": self.identity})
        log.close()
        wait_for("claimwarden's liveness endpoint", self.alive, 60)
        if lead:
            wait_for(f"{self.identity} to lead", self.leads, 60)

    def leads(self) -> bool:
        """True when its metrics say it holds the leader lease (and runs the controllers)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"claimwarden exited with {self.proc.returncode}; log:\n{self.log_tail()}")
        text = fetch(f"http://127.0.0.1:{self.metrics_port}/metrics") or ""
        return "\nclaimwarden_leader 1.0" in text

    def ready(self) -> bool:
        """True when its /readyz answers 200 (readiness.py: indexed, and the Lease read within a lease duration)."""
        return fetch(f"http://127.0.0.1:{self.readiness_port}/readyz") is not None

    def alive(self) -> bool:
        """True when its liveness endpoint answers; raises if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"claimwarden exited with {self.proc.returncode}; log:\n{self.log_tail()}")
        return fetch(f"http://127.0.0.1:{self.liveness_port}/healthz") is not None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        code = stop_process(self.proc, 30)
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: no clean-up handlers run, as when a node dies under the operator."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: the process stays, its watches and requests hang (a stalled node, a long GC pause)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        was_running = self.running
        self.stop()
        try:
            yield
        finally:
            if was_running:
                self.start()

    def metrics(self) -> str:
        text = fetch(f"http://127.0.0.1:{self.metrics_port}/metrics")
        assert text is not None, "claimwarden's metrics endpoint did not answer"
        return text

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextlib.contextmanager
def replica_pair(kubeconfig: Path, directory: Path, *, identities: tuple[str, str],
                 extra: list[str] | None = None) -> Iterator[list[Operator]]:
    """Two replicas, as a Deployment of two runs them: the first leads, the second stands by; both are
    stopped afterwards."""
    first = Operator(kubeconfig, directory / "a.log", extra, identity=identities[0])
    second = Operator(kubeconfig, directory / "b.log", extra, identity=identities[1])
    try:
        first.start()
        second.start(lead=False)
        yield [first, second]
    finally:
        for replica in (first, second):
            if replica.running:
                replica.stop()
