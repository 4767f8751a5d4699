"""Starting, probing and stopping the lab's background processes, always by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class LabError(RuntimeError):
    """A lab operation failed; the message is one line naming the cause and the fix."""


@dataclass
class Process:
    name: str
    pid: int
    binary: str
    log: str
    # When the kernel started the process (/proc/PID/stat field 22): with the PID it identifies the
    # process for good, even if the PID is later reused, and unlike the command line it is already
    # final when Popen returns.
    started: int = 0
    # The command line and the extra environment it was started with, so `restart` repeats it exactly.
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Process:
        return cls(name=data["name"], pid=int(data["pid"]), binary=data["binary"], log=data["log"],
                   started=int(data.get("started", 0)), argv=[str(a) for a in data.get("argv", [])],
                   env={str(k): str(v) for k, v in (data.get("env") or {}).items()})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[19]) if fields else 0  # field 22 of stat; fields[0] is field 3


def is_running(proc: Process) -> bool:
    """True if the process we started is still alive (not a zombie, not a reused PID)."""
    fields = _stat(proc.pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    if proc.started:
        return int(fields[19]) == proc.started
    try:  # a state file from before start times were recorded
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.split(b"\0", 1)[0].decode(errors="replace") == proc.binary


def start(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Process:
    """Start ``argv`` in its own session (so it outlives us) with output to ``log_dir/name.log``."""
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, env={**os.environ, **(env or {})})
    return Process(name=name, pid=popen.pid, binary=argv[0], log=str(log_path), started=start_time(popen.pid),
                   argv=list(argv), env=dict(env or {}))


def restart(proc: Process) -> Process:
    """Stop ``proc`` by PID and start it again with the same argv and environment, logging to the same file."""
    if not proc.argv:
        raise LabError(f"{proc.name} was started by an older claimwarden that did not record its command "
                       "line; run 'claimwarden lab down' and 'lab up' again")
    stop(proc)
    return start(proc.name, proc.argv, Path(proc.log).parent, proc.env)


def stop(proc: Process, grace: float = 15.0) -> None:
    """SIGTERM the process group we created, then SIGKILL after ``grace`` seconds."""
    if not is_running(proc):
        _reap(proc.pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(proc.pid)
        if not is_running(proc):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for _ in range(50):
        _reap(proc.pid)
        if not is_running(proc):
            return
        time.sleep(0.1)


def _reap(pid: int) -> str:
    """Collect our own exited child, if it is one, so it does not linger as a zombie; say how it ended."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        return ""
    if reaped != pid:
        return ""
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def log_tail(proc: Process, lines: int = 15) -> str:
    try:
        text = Path(proc.log).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def explain_exit(proc: Process, how: str = "") -> str:
    """One line saying why a component died, from what it logged."""
    tail = log_tail(proc, 60)
    if "address already in use" in tail:
        return (f"{proc.name} could not listen: a port it needs is already in use "
                f"(see {proc.log}); stop what uses it or run 'claimwarden lab down'")
    last = [line for line in tail.splitlines() if line.strip()]
    ended = f" ({how})" if how else ""
    return f"{proc.name} exited during start-up{ended}: {last[-1] if last else 'no output'} (log: {proc.log})"


def http_ok(url: str, ca_file: str | None = None, timeout: float = 2.0) -> bool:
    if url.startswith("https"):
        if ca_file:
            context = ssl.create_default_context(cafile=ca_file)
        else:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    else:
        context = None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def wait_until(what: str, check: Callable[[], bool], timeout: float, watched: list[Process],
               interval: float = 0.25) -> None:
    """Poll ``check``; fail early with the reason if one of ``watched`` dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in watched:
            if not is_running(proc):
                raise LabError(explain_exit(proc, _reap(proc.pid)))
        if check():
            return
        time.sleep(interval)
    logs = ", ".join(p.log for p in watched)
    raise LabError(f"timed out after {timeout:.0f}s waiting for {what}; see the logs: {logs}")
