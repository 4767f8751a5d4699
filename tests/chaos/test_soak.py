"""The soak: two replicas under steady churn for SOAK_MINUTES (5 by default: CI's slice; `make soak`: 60).

- 20 pods a second created, and as many deleted (the oldest first, so that RATE x lifetime pods live);
- a device marked every minute (the next of the lab's devices, with or without a pod), and the previous
  mark cleared;
- the leader SIGKILLed every 10 minutes (in a run shorter than 20 minutes: once, half-way);
- every 10 s: each replica's RSS (/proc) and the leader's queue depths (/metrics); the audit log's writes.

Figures (printed, and written to $SOAK_FIGURES, else soak-figures.json in the test's directory): RSS slope
per replica process, claimwarden's writes per object, queue depth over time. Then every invariant of
checker.py must hold, as after each chaos scenario.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab.cluster import LabState
from tests.integration.auditor import LabAudit, Rules
from tests.integration.conftest import extra_lab
from tests.integration.helpers import pod_with_claims, template, wait_for
from tests.integration.operator import fetch

from . import checker, soak_figures
from .soak_figures import RssSample
from .test_chaos import Replicas, _mark, converge, record

MINUTES = float(os.environ.get("SOAK_MINUTES", "5"))
RATE = 20.0
"""Pods created per second (and as many deleted)."""
NODES, GPUS, ALIVE = 40, 8, 200
"""320 devices; 200 pods alive at once live about ALIVE / RATE = 10 s each."""
MARK_EVERY, KILL_EVERY, SAMPLE_EVERY = 60.0, 600.0, 10.0


@pytest.fixture(scope="module")
def soak_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    # kube-controller-manager's garbage collector deletes the claims of 20 deleted pods a second: its
    # default client budget (20 QPS, shared with every other controller of it) would be what is measured.
    # A device marked again after an hour of other marks is written by each of its records' passes.
    with extra_lab(tmp_path_factory, rules=Rules(max_writes=40), nodes=NODES, gpus_per_node=GPUS,
                   kcm_qps=200) as state:
        yield state


class SteadyChurn:
    """RATE pods a second created and the oldest deleted beyond ALIVE, by a few threads, on a fixed schedule."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.created = self.deleted = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-churn", daemon=True)

    def __enter__(self) -> SteadyChurn:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.took = time.monotonic() - self.started

    def _create(self, name: str) -> None:
        try:
            self.core.create_namespaced_pod(self.namespace, body=pod_with_claims(
                name, [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]))
            self.created += 1
        except ApiException:
            self.failed += 1

    def _delete(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
            self.deleted += 1
        except ApiException:
            self.failed += 1

    def _run(self) -> None:
        alive: collections.deque[str] = collections.deque()
        with ThreadPoolExecutor(8, thread_name_prefix="soak-churn") as pool:
            i = 0
            while not self._stop.wait(max(0.0, self.started + i / RATE - time.monotonic())):
                name = f"soak-{i}"
                pool.submit(self._create, name)
                alive.append(name)
                if len(alive) > ALIVE:
                    pool.submit(self._delete, alive.popleft())
                i += 1


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _slim(event: dict[str, Any]) -> dict[str, Any]:
    """What the checker reads of an event (so that an hour's log fits in memory)."""
    ref = event.get("objectRef") or {}
    keep = {k: event.get(k) for k in ("stage", "verb", "user", "userAgent", "objectRef", "responseStatus",
                                      "requestReceivedTimestamp", "stageTimestamp")}
    keep["user"] = {"username": (event.get("user") or {}).get("username")}
    keep["responseStatus"] = {"code": (event.get("responseStatus") or {}).get("code")}
    if ref.get("resource") == "leases" or ref.get("namespace") == checker.OWN_NAMESPACE:
        keep["requestObject"] = event.get("requestObject")
    return keep


# The suite's 600 s per test would stop the hour: the load's length, plus the drain and the convergence after it.
@pytest.mark.timeout(int(MINUTES * 60) + 900)
def test_soak(soak_lab: LabState, tmp_path: Path) -> None:
    api = config.new_client_from_config(config_file=str(soak_lab.kubeconfig))
    namespace = "soak"
    core = client.CoreV1Api(api)
    core.create_namespace(body={"metadata": {"name": namespace}})
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("gpu"))
    replicas = Replicas(soak_lab, tmp_path, extra=())  # the breaker as shipped
    audit = LabAudit(soak_lab)
    events: list[dict[str, Any]] = []
    writes = soak_figures.WriteCounts()
    rss: list[RssSample] = []
    depths: list[tuple[float, str, float]] = []
    marks: list[tuple[str, str]] = []  # (slice, device)
    devices = [(s.metadata.name, d.name) for s in client.ResourceV1Api(api).list_resource_slice().items
               for d in s.spec.devices or []]
    kill_every = KILL_EVERY if MINUTES * 60 >= 2 * KILL_EVERY else MINUTES * 30
    failovers: list[float] = []

    def read_audit() -> None:
        new = audit.new_events()
        writes.add(new)
        events.extend(map(_slim, new))

    replicas.start()
    try:
        with SteadyChurn(api, namespace) as churn:
            start = churn.started
            next_sample, next_mark, next_kill = start, start + MARK_EVERY, start + kill_every
            while (now := time.monotonic()) - start < MINUTES * 60:
                if now >= next_sample:
                    next_sample += SAMPLE_EVERY
                    for replica in replicas.all:
                        proc = replica.proc
                        kib = _rss_kib(proc.pid) if proc is not None else None
                        if proc is not None and kib is not None:
                            rss.append(RssSample(now - start, replica.identity.rsplit("-", 1)[-1], proc.pid, kib))
                    leader = replicas.leader()
                    page = fetch(f"http://127.0.0.1:{leader.metrics_port}/metrics") if leader else None
                    for controller, depth in soak_figures.queue_depths(page or "").items():
                        depths.append((now - start, controller, depth))
                    read_audit()
                if now >= next_mark:
                    next_mark += MARK_EVERY
                    if marks:
                        _mark(api, *marks[-1], None)
                    marks.append(devices[(len(marks) * 37) % len(devices)])  # spread over nodes and devices
                    _mark(api, *marks[-1], f"soak mark {len(marks)}")
                if now >= next_kill:
                    next_kill += kill_every
                    failovers.append(replicas.kill_leader())
                time.sleep(0.5)
        if marks:
            _mark(api, *marks[-1], None)
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        wait_for("the soak's pods gone", lambda: not core.list_namespaced_pod(namespace).items, 300)
        read_audit()
        took, result = converge(api, audit, events, timeout=300)  # what it reads is not in the write counts
    finally:
        replicas.stop()
        api.close()
    figures = {
        "minutes": MINUTES, "rate_per_second": RATE, "alive": ALIVE, "nodes": NODES, "gpus_per_node": GPUS,
        "pods_created": churn.created, "pods_deleted": churn.deleted, "api_errors": churn.failed,
        "created_per_second": round(churn.created / churn.took, 1), "marks": len(marks),
        "leader_kills": len(failovers), "next_leader_seconds": [round(t, 1) for t in failovers],
        "converged_seconds": round(took, 1), "replica_restarts": replicas.restarts,
        "rss": soak_figures.rss_figures(rss), "writes_per_object": writes.figures(),
        "queue_depth": soak_figures.queue_depth_figures(depths),
    }
    path = Path(os.environ.get("SOAK_FIGURES") or tmp_path / "soak-figures.json")
    path.write_text(json.dumps(figures, indent=2))
    print(f"\nsoak figures ({path}):")
    for key in ("minutes", "pods_created", "pods_deleted", "created_per_second", "api_errors", "marks",
                "leader_kills", "next_leader_seconds", "converged_seconds"):
        print(f"soak: {key}: {figures[key]}")
    for life in figures["rss"]:
        print(f"soak: rss {life}")
    for row in figures["writes_per_object"]:
        print(f"soak: writes {row}")
    for controller, row in figures["queue_depth"].items():
        print(f"soak: queue depth {controller}: {row}")
    record(f"soak {MINUTES:g} min", f"{churn.created} pods created at {figures['created_per_second']}/s",
           f"{len(marks)} marks and clears, {len(failovers)} leader SIGKILLs", failovers, took, result)
