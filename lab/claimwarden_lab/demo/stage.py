"""The stage the scenes play on: the lab's kubectl, waiting for the cluster, and reading what it holds.

A scene never sleeps for pacing: it polls the API (`Stage.wait`) until the state the next command
shows has come, and fails with a one-line message naming what did not come when a timeout passes.
`Stage.kubectl` explains, shows and runs one command and prints its real output. The stage also
carries what one scene leaves for the next (the broken device, its mark) and what the set-up
started (lifecycle.py fills in the lab, the API client and claimwarden).
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .. import cluster, driver
from ..processes import Process, is_running, log_tail
from .narration import Style, command_text
from .options import CLAIMWARDEN_NAMESPACE, LOG_NAME, NAMESPACE, DemoError, DemoOptions, parse_models

T = TypeVar("T")

WAIT_SECONDS = 60.0
POLL_SECONDS = 0.2
RECORDS = ("claimwarden.io", "v1alpha1", "unhealthydevices")

# One table for the experiments: which claim holds which device, and for whom.
CLAIM_COLUMNS = ("custom-columns=CLAIM:.metadata.name,NODE:.status.allocation.devices.results[*].pool,"
                 "DEVICE:.status.allocation.devices.results[*].device,RESERVED_FOR:.status.reservedFor[*].name")


class Stage:
    """What the scenes act through and share; the lab, the client and claimwarden come from lifecycle.setup."""

    def __init__(self, options: DemoOptions, out: TextIO, style: Style) -> None:
        self.options = options
        self.out = out
        self.style = style
        self.directory = options.dir.expanduser().resolve()
        self.models = parse_models(options.models)
        self.state: cluster.LabState | None = None
        self.started_lab = False
        self.claimwarden: Process | None = None
        self.metrics_port = 0
        self.api: client.ApiClient | None = None
        self.marked: tuple[str, str] | None = None  # (slice, device) while a device is marked
        self.seen = ""  # what the last probe saw, for a timeout's message
        self.broken: tuple[str, str] = ("", "")  # (node, device) of the broken GPU

    # output ----------------------------------------------------------------------------------------

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def say(self, text: str) -> None:
        self.print(self.style.note(text))

    def kubectl(self, explanation: str, *args: str, stdin: str | None = None) -> str:
        """Explain, show and run one kubectl command; print its real output; fail if it fails."""
        assert self.state is not None
        self.say(explanation)
        self.print(self.style.command(command_text(args, stdin)))
        result = subprocess.run([f"{self.state.bin_dir}/kubectl", f"--kubeconfig={self.state.kubeconfig}", *args],
                                input=stdin, capture_output=True, text=True, timeout=120, check=False)
        text = (result.stdout + result.stderr).rstrip("\n")
        if text:
            self.print(text)
        if result.returncode:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise DemoError(f"'{command_text(args)}' failed with exit code {result.returncode}: {last}")
        return result.stdout

    def apply(self, explanation: str, manifest: str) -> None:
        self.kubectl(explanation, "apply", "-n", NAMESPACE, "-f", "-", stdin=manifest)

    # waiting ---------------------------------------------------------------------------------------

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float = WAIT_SECONDS) -> T:
        """Poll ``probe`` until it returns something truthy; claimwarden must stay alive meanwhile."""
        deadline = time.monotonic() + timeout
        self.seen = ""
        while True:
            self.check_claimwarden()
            try:
                result = probe()
            except ApiException as exc:
                self.seen = f"the API answered {exc.status} {exc.reason}"
                result = None
            if result:
                return result
            if time.monotonic() >= deadline:
                seen = f" (last seen: {self.seen})" if self.seen else ""
                raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}{seen}; "
                                f"claimwarden's log: {self.log_path()}")
            time.sleep(POLL_SECONDS)

    def check_claimwarden(self) -> None:
        if self.claimwarden is not None and not is_running(self.claimwarden):
            last = log_tail(self.claimwarden, 1) or "no output"
            raise DemoError(f"claimwarden exited: {last} (log: {self.log_path()})")

    def log_path(self) -> Path:
        return self.directory / "logs" / f"{LOG_NAME}.log"

    # reading the cluster ---------------------------------------------------------------------------

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def resource(self) -> client.ResourceV1Api:
        return client.ResourceV1Api(self.api)

    # The client's models type every field as optional; these helpers read objects the demo created
    # and waited for, so they take and return Any rather than assert each level.

    def pod(self, name: str) -> Any:
        try:
            return self.core.read_namespaced_pod(name, NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def running(self, *names: str) -> list[Any] | None:
        pods: list[Any] = [self.pod(n) for n in names]
        self.seen = ", ".join(f"{n}: {p.status.phase if p else 'absent'}" for n, p in zip(names, pods, strict=True))
        if all(p is not None and p.status.phase == "Running" for p in pods):
            return pods
        return None

    def claims(self, namespace: str = NAMESPACE) -> list[Any]:
        return list(self.resource.list_namespaced_resource_claim(namespace).items)

    def claim_of(self, pod: Any) -> Any:
        """The (only) claim of ``pod``: its template claim as recorded in its status, or the named claim."""
        [source] = pod.spec.resource_claims
        name = source.resource_claim_name
        for status in pod.status.resource_claim_statuses or []:
            if status.name == source.name:
                name = status.resource_claim_name
        return self.resource.read_namespaced_resource_claim(name, NAMESPACE)

    @staticmethod
    def devices_of(claim: Any) -> list[tuple[str, str]]:
        allocation = claim.status.allocation if claim.status else None
        return [(r.pool, r.device) for r in allocation.devices.results] if allocation else []

    def slices(self) -> list[Any]:
        return [s for s in self.resource.list_resource_slice().items if s.spec.driver == driver.DRIVER]

    def free_devices(self) -> dict[str, list[tuple[str, str]]]:
        """node -> [(device, model)] not allocated to any claim, in the order the slices list them."""
        claims: list[Any] = self.resource.list_resource_claim_for_all_namespaces().items
        taken = {(r.pool, r.device) for c in claims
                 if c.status and c.status.allocation for r in c.status.allocation.devices.results
                 if r.driver == driver.DRIVER}
        free: dict[str, list[tuple[str, str]]] = {}
        for s in sorted(self.slices(), key=lambda s: s.spec.node_name or ""):
            free.setdefault(s.spec.node_name, []).extend(
                (d.name, d.attributes["model"].string) for d in s.spec.devices or []
                if (s.spec.pool.name, d.name) not in taken)
        return free

    def record_of(self, pool: str, device: str) -> dict[str, Any] | None:
        """The UnhealthyDevice record of one device (other records in a reused lab are not ours)."""
        listed = cast(dict[str, Any], client.CustomObjectsApi(self.api).list_cluster_custom_object(*RECORDS))
        items: list[dict[str, Any]] = listed["items"]
        return next((r for r in items if (r["spec"].get("pool"), r["spec"].get("device")) == (pool, device)), None)

    def quarantined(self, pool: str, device: str) -> bool:
        return any(self.devices_of(c) == [(pool, device)] for c in self.claims(CLAIMWARDEN_NAMESPACE))

    def events(self, pod: str, reason: str) -> list[Any]:
        selector = f"involvedObject.name={pod},reason={reason}"
        return list(self.core.list_namespaced_event(NAMESPACE, field_selector=selector).items)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def claim_table(self, explanation: str) -> str:
        return self.kubectl(explanation, "get", "resourceclaims", "-n", NAMESPACE, "-o", CLAIM_COLUMNS)

