"""A slow (or cut) link between one claimwarden replica and the lab's apiserver.

The lab's TCP forwarder (`claimwarden_lab.forward`) sits between the replica and the apiserver;
`delay` sets how long what the replica sends takes to arrive (answers are not delayed). It models
latency on the wire: a request the replica gave up on still arrives (forward.py says exactly what
it models). `cut` partitions the link until `heal`: nothing passes either way, what is sent
meanwhile is dropped, and connections that lost bytes are reset when it heals.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path
from types import TracebackType

import yaml

from claimwarden_lab.cluster import LabState
from claimwarden_lab.processes import free_port

from .helpers import stop_process, wait_for


class SlowLink:
    def __init__(self, lab: LabState, directory: Path) -> None:
        self.lab = lab
        self.directory = directory
        self.port = free_port()
        self.delay_file = directory / "link-delay"
        self.partition_file = directory / "link-partitioned"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SlowLink:
        target = urllib.parse.urlsplit(self.lab.api_url).port
        self.delay(0)
        self.heal()
        with (self.directory / "forward.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "claimwarden_lab.forward", "127.0.0.1", str(self.port), str(target),
                 "--delay-file", str(self.delay_file), "--partition-file", str(self.partition_file)],
                stdout=log, stderr=subprocess.STDOUT)
        wait_for("the forwarder to listen", self._listening, 10, interval=0.1)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.proc is not None:
            stop_process(self.proc, 5)
            self.proc = None

    def _listening(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, "the forwarder exited"
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def kubeconfig(self, direct: Path) -> Path:
        """A copy of the kubeconfig ``direct`` whose server is reached through this link."""
        config = yaml.safe_load(direct.read_text())
        for cluster in config["clusters"]:
            server = urllib.parse.urlsplit(cluster["cluster"]["server"])
            cluster["cluster"]["server"] = server._replace(netloc=f"{server.hostname}:{self.port}").geturl()
        path = self.directory / f"{direct.stem}-slow-link.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def delay(self, seconds: float) -> None:
        """From now on, what the replica sends arrives ``seconds`` later."""
        partial = self.delay_file.with_suffix(".partial")
        partial.write_text(f"{seconds:g}")
        os.replace(partial, self.delay_file)

    def cut(self) -> None:
        """Partition the link: from now on nothing passes either way (until `heal`)."""
        self.partition_file.touch()

    def heal(self) -> None:
        self.partition_file.unlink(missing_ok=True)
