"""Benchmark (issue 21's targets): one signal at a time, per source, to its observation in the record; and a
driver taint under an Enforce NoExecute rule to the first eviction.

A lab of `--nodes` kwok nodes of 8 GPUs (the device-taints preset, ResourceHealthStatus on), the apiserver
auditing every request, claimwarden alone (no leader election) with the Alertmanager webhook on (a bearer
token) and its breaker off (``--breaker-max-fraction 1``: what is timed here is the path, not the breaker).
One HealthPolicy for the driver: a Shadow rule per source (nothing is evicted or quarantined for them) and
an Enforce NoExecute rule on the driver taint value 79. `--signals` N signals per source, one at a time (the
next once the last is seen):

- DriverTaint: a slice patch adding the taint to one free device (a new device each time);
- PodStatus: pods/status of a running pod set to KEP-4680 ``Unhealthy`` for its device, as a kubelet would;
- Alertmanager: a webhook call, as Alertmanager's, with the token, one firing alert with ``dra_*`` labels
  on a free device (the call returns once it is written: the webhook waits for its records);
- NodeCondition: the node status of one node, condition GPUProblem=True with a new lastTransitionTime (its
  8 devices observe it: the first record and the last are both timed);
- Eviction: a slice patch tainting the device of a running pod with xid 79; timed to the pod's
  deletionTimestamp (or its deletion) as a watch sees it, and to the eviction's create in the audit log
  (the apiserver's clock on both ends: from the slice patch's arrival).

Latency: from just before the signal's write is sent to the moment this benchmark's own watch of the
UnhealthyDevices receives the record with that observation. Beside each: claimwarden's API calls per signal
(the audit log, watches left out, by user agent) and its CPU seconds per signal (/proc), over the phase.

    .venv/bin/python bench/signals_latency.py [--signals 30] [--nodes 16]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eviction_throughput import AGENTS, Audit, _cpu_seconds  # bench/, beside this file
from kubernetes import client, config, watch
from signals_burst import create_gpu_pods, install_crds

from claimwarden.health.records import DeviceRef
from claimwarden.signals.records import signal_record_name
from claimwarden_lab import cluster
from claimwarden_lab.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
DRIVER, KEY, NAMESPACE = "gpu.example.com", "gpu.example.com/xid", "latency"
GROUP, VERSION, RECORDS = "claimwarden.io", "v1alpha1", "unhealthydevices"
ALERT, CONDITION = "GpuXidError", "GPUProblem"
SHADOW = {"effect": "NoExecute", "mode": "Shadow"}
POLICY = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HealthPolicy", "metadata": {"name": "latency"},
          "spec": {"drivers": [DRIVER], "rules": [
              {"name": "taint", "source": "DriverTaint", "signal": KEY, "values": ["31"], **SHADOW},
              {"name": "pod", "source": "PodStatus", "values": ["Unhealthy"], **SHADOW},
              {"name": "alert", "source": "Alertmanager", "signal": ALERT, **SHADOW},
              {"name": "node", "source": "NodeCondition", "signal": CONDITION, "values": ["True"], **SHADOW},
              {"name": "evict", "source": "DriverTaint", "signal": KEY, "values": ["79"], "effect": "NoExecute",
               "mode": "Enforce"}]}}
SEEN_LIMIT = 60.0  # seconds one signal may take to be seen before the benchmark gives up on it (and says so)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _summary(latencies: list[float], missed: int) -> dict[str, Any]:
    if not latencies:
        return {"n": 0, "missed": missed}
    return {"n": len(latencies), "missed": missed, "p50_s": round(_percentile(latencies, 0.5), 3),
            "p99_s": round(_percentile(latencies, 0.99), 3), "max_s": round(max(latencies), 3)}


class RecordWatch:
    """This benchmark's watch of the UnhealthyDevices: when each (record, observation key) was first received."""

    def __init__(self, api: client.ApiClient) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.seen: dict[tuple[str, str], float] = {}
        self.observations: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        version = self.objects.list_cluster_custom_object(GROUP, VERSION, RECORDS)["metadata"]["resourceVersion"]
        while not self._stop:
            stream = watch.Watch()
            try:
                for event in stream.stream(self.objects.list_cluster_custom_object, GROUP, VERSION, RECORDS,
                                           resource_version=version, timeout_seconds=30):
                    at = time.monotonic()
                    record = event["object"]
                    version = record["metadata"]["resourceVersion"]
                    name = record["metadata"]["name"]
                    found = list((record.get("status") or {}).get("observations") or [])
                    with self._lock:
                        self.observations[name] = found
                        for o in found:
                            self.seen.setdefault((name, str(o.get("key"))), at)
                        self._lock.notify_all()
                    if self._stop:
                        break
            except Exception as exc:  # an expired resourceVersion: list again
                if self._stop:
                    return
                print(f"watch: {exc}; listing again", file=sys.stderr)
                version = self.objects.list_cluster_custom_object(GROUP, VERSION, RECORDS)["metadata"][
                    "resourceVersion"]

    def wait(self, record: str, matches: Callable[[dict[str, Any]], bool], limit: float = SEEN_LIMIT
             ) -> float | None:
        """When the watch first received `record` with an observation that `matches` (monotonic), or None."""
        deadline = time.monotonic() + limit
        with self._lock:
            while True:
                for o in self.observations.get(record, []):
                    if matches(o):
                        return self.seen[(record, str(o.get("key")))]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)

    def stop(self) -> None:
        self._stop = True


def _record(pool: str, device: str) -> str:
    return signal_record_name(DeviceRef(DRIVER, pool, device))


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Bench:
    def __init__(self, state: cluster.LabState, api: client.ApiClient, records: RecordWatch, pid: int,
                 webhook: str, token: str) -> None:
        self.state, self.api, self.records, self.pid = state, api, records, pid
        self.webhook, self.token = webhook, token
        self.objects, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def phase(self, run: Callable[[], tuple[list[float], int]], signals: int, **extra: Any) -> dict[str, Any]:
        """`run`'s latencies, with claimwarden's API calls and CPU seconds per signal over it."""
        audit = Audit(self.state.audit_log, *AGENTS["claimwarden"])
        cpu = _cpu_seconds(self.pid)
        latencies, missed = run()
        time.sleep(2)  # the writes that follow the observation (the health controller's) belong to the signal
        calls = audit.calls()
        figures = _summary(latencies, missed)
        figures.update(extra)
        figures["api_calls_per_signal"] = round(sum(calls.values()) / signals, 1)
        figures["writes_per_signal"] = round(sum(n for (verb, _), n in calls.items()
                                                 if verb in ("create", "patch", "update", "delete")) / signals, 1)
        figures["cpu_s_per_signal"] = round((_cpu_seconds(self.pid) - cpu) / signals, 3)
        return figures

    def _slice(self, pool: str) -> dict[str, Any]:
        found = [s for s in self.objects.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
                 if s["spec"]["pool"]["name"] == pool and s["spec"]["driver"] == DRIVER]
        return dict(found[0])

    def taint(self, pool: str, device: str, value: str) -> float:
        """Adds the taint to the device's slice entry; returns the moment just before the patch was sent."""
        current = self._slice(pool)
        devices = current["spec"]["devices"]
        for entry in devices:
            if entry["name"] == device:
                entry["taints"] = [{"key": KEY, "value": value, "effect": "NoSchedule", "timeAdded": _now_rfc3339()}]
        sent = time.monotonic()
        self.objects.patch_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", current["metadata"]["name"],
            {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "spec": {"devices": devices}})
        return sent

    def taints(self, devices: list[tuple[str, str]]) -> tuple[list[float], int]:
        latencies: list[float | None] = []
        for pool, device in devices:
            sent = self.taint(pool, device, "31")
            seen = self.records.wait(_record(pool, device), lambda o: o["source"] == "DriverTaint"
                                     and o["value"] == "31")
            _count(latencies, seen, sent)
        return _split(latencies)

    def pod_health(self, pods: list[tuple[str, str, str]]) -> tuple[list[float], int]:
        latencies: list[float | None] = []
        for pod, pool, device in pods:
            body = {"status": {"containerStatuses": [{"name": "ctr0", "allocatedResourcesStatus": [{
                "name": "claim:gpu", "resources": [{"resourceID": f"{DRIVER}/{pool}/{device}",
                                                    "health": "Unhealthy"}]}]}]}}
            sent = time.monotonic()
            self.core.patch_namespaced_pod_status(pod, NAMESPACE, body, _preload_content=False)
            seen = self.records.wait(_record(pool, device), lambda o: o["source"] == "PodStatus"
                                     and o["state"] == "Unhealthy")
            _count(latencies, seen, sent)
        return _split(latencies)

    def alerts(self, devices: list[tuple[str, str]]) -> tuple[list[float], int]:
        latencies: list[float | None] = []
        for pool, device in devices:
            fingerprint = secrets.token_hex(8)
            payload = {"version": "4", "status": "firing", "receiver": "claimwarden", "groupKey": fingerprint,
                       "alerts": [{"status": "firing", "labels": {
                           "alertname": ALERT, "xid": "48", "dra_driver_name": DRIVER, "dra_pool_name": pool,
                           "dra_device_name": device}, "annotations": {}, "startsAt": _now_rfc3339(),
                           "endsAt": "0001-01-01T00:00:00Z", "fingerprint": fingerprint}]}
            request = urllib.request.Request(self.webhook, data=json.dumps(payload).encode(), method="POST",
                                             headers={"Authorization": f"Bearer {self.token}",
                                                      "Content-Type": "application/json"})
            sent = time.monotonic()
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200, response.status
            seen = self.records.wait(_record(pool, device), lambda o: o["source"] == "Alertmanager")
            _count(latencies, seen, sent)
        return _split(latencies)

    def node_conditions(self, node: str, devices: list[str], signals: int) -> tuple[list[float], int, list[float]]:
        first_seen, all_seen, missed = [], [], 0
        for _ in range(signals):
            time.sleep(1.1)  # lastTransitionTime has second precision: each signal a new one
            at = _now_rfc3339()
            condition = {"type": CONDITION, "status": "True", "reason": "Bench", "message": "ECC storm",
                         "lastTransitionTime": at, "lastHeartbeatTime": at}
            sent = time.monotonic()
            self.core.patch_node_status(node, {"status": {"conditions": [condition]}})
            seen = [self.records.wait(_record(node, d), lambda o, at=at: o["source"] == "NodeCondition"
                                      and o["at"] == at) for d in devices]
            if any(s is None for s in seen):
                missed += 1
                continue
            first_seen.append(min(s for s in seen if s is not None) - sent)
            all_seen.append(max(s for s in seen if s is not None) - sent)
        return first_seen, missed, all_seen

    def evictions(self, pods: list[tuple[str, str, str]]) -> tuple[list[float], int, list[float]]:
        """Per pod: the taint patch -> its deletionTimestamp or deletion seen by a watch; and the same from the
        audit log (the slice patch's and the eviction's requestReceivedTimestamp)."""
        latencies, audited, missed = [], [], 0
        for pod, pool, device in pods:
            stream = watch.Watch()
            version = self.core.list_namespaced_pod(NAMESPACE).metadata.resource_version
            offset = self.state.audit_log.stat().st_size
            sent = self.taint(pool, device, "79")
            gone = None
            for event in stream.stream(self.core.list_namespaced_pod, NAMESPACE, resource_version=version,
                                       field_selector=f"metadata.name={pod}", timeout_seconds=int(SEEN_LIMIT)):
                if event["type"] == "DELETED" or event["object"].metadata.deletion_timestamp is not None:
                    gone = time.monotonic()
                    stream.stop()
            if gone is None:
                missed += 1
                continue
            latencies.append(gone - sent)
            time.sleep(0.5)  # the audit log is written as the requests complete
            patched = evicted = None
            with self.state.audit_log.open("rb") as handle:
                handle.seek(offset)
                for line in handle.read().decode(errors="replace").splitlines():
                    entry = json.loads(line)
                    ref = entry.get("objectRef") or {}
                    if entry.get("stage") != "ResponseComplete":
                        continue
                    if ref.get("resource") == "resourceslices" and entry.get("verb") == "patch" and patched is None:
                        patched = entry["requestReceivedTimestamp"]
                    if ref.get("resource") == "pods" and ref.get("subresource") == "eviction" and \
                            ref.get("name") == pod and evicted is None:
                        evicted = entry["requestReceivedTimestamp"]
            if patched and evicted:
                audited.append(_micro(evicted) - _micro(patched))
        return latencies, missed, audited


def _count(latencies: list[float | None], seen: float | None, sent: float) -> None:
    latencies.append(None if seen is None else seen - sent)


def _split(latencies: list[float | None]) -> tuple[list[float], int]:
    """The latencies seen, and how many were not seen within SEEN_LIMIT."""
    return [x for x in latencies if x is not None], sum(x is None for x in latencies)


def _micro(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _allocated(api: client.ApiClient) -> dict[str, tuple[str, str]]:
    """Pod name -> (pool, device) of its claim, for the running pods of the namespace."""
    found = {}
    claims = client.ResourceV1Api(api).list_namespaced_resource_claim(NAMESPACE).items
    for claim in claims:
        if claim.status and claim.status.allocation and claim.status.reserved_for:
            result = claim.status.allocation.devices.results[0]
            found[claim.status.reserved_for[0].name] = (result.pool, result.device)
    return found


def measure(signals: int, nodes: int, version: str, directory: Path) -> dict[str, Any]:
    gates = "ResourceHealthStatus=true" if version < "1.36" else ""
    options = cluster.LabOptions(dir=directory / "lab", nodes=nodes, gpus_per_node=8, presets="device-taints",
                                 feature_gates=gates, kubernetes=version, audit_all=True)
    state = cluster.up(options, say=lambda line: print(f"lab: {line}"))
    operator = records = None
    try:
        install_crds(state)
        api = config.new_client_from_config(config_file=str(state.kubeconfig))
        # claimwarden first: it makes the pods' claims from their template (the lab's KCM does not).
        token = secrets.token_hex(16)
        (directory / "token").write_text(token + "\n")
        port = free_port()
        log = (directory / "claimwarden.log").open("wb")
        operator = subprocess.Popen(
            [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(state.kubeconfig),
             "--leader-elect=false", "--metrics-port", str(free_port()), "--breaker-max-fraction", "1",
             "--liveness", f"http://127.0.0.1:{free_port()}/healthz", "--alert-token-file", str(directory / "token"),
             "--alert-webhook-address", "127.0.0.1", "--alert-webhook-port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
        client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, "healthpolicies", POLICY)
        core = client.CoreV1Api(api)
        create_gpu_pods(api, NAMESPACE, 2 * signals)  # half report their health, half are evicted
        deadline = time.monotonic() + 300
        while True:
            held = _allocated(api)
            running = {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items
                       if p.status.phase == "Running"}
            pods = sorted((name, *where) for name, where in held.items() if name in running)
            if len(pods) >= 2 * signals or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert len(pods) >= 2 * signals, f"only {len(pods)} of {2 * signals} pods run with a device"
        busy = {(pool, device) for _, pool, device in pods}
        slices = client.CustomObjectsApi(api).list_cluster_custom_object("resource.k8s.io", "v1",
                                                                          "resourceslices")["items"]
        condition_node = sorted(s["spec"]["nodeName"] for s in slices)[-1]
        free = sorted((s["spec"]["pool"]["name"], d["name"]) for s in slices for d in s["spec"]["devices"]
                      if (s["spec"]["pool"]["name"], d["name"]) not in busy
                      and s["spec"]["pool"]["name"] != condition_node)
        assert len(free) >= 2 * signals, f"only {len(free)} free devices; --nodes must be larger"

        records = RecordWatch(api)
        time.sleep(15)  # claimwarden up, its indices filled, the first reconciles done
        bench = Bench(state, api, records, operator.pid, f"http://127.0.0.1:{port}/alerts", token)
        results: dict[str, Any] = {"kubernetes": version, "signals_per_source": signals, "nodes": nodes}
        results["DriverTaint"] = bench.phase(lambda: bench.taints(free[:signals]), signals)
        results["PodStatus"] = bench.phase(lambda: bench.pod_health(pods[:signals]), signals)
        results["Alertmanager"] = bench.phase(lambda: bench.alerts(free[signals:2 * signals]), signals)
        node_devices = sorted(d["name"] for s in slices if s["spec"]["nodeName"] == condition_node
                              for d in s["spec"]["devices"])
        every: list[float] = []

        def conditions() -> tuple[list[float], int]:
            first, missed, last = bench.node_conditions(condition_node, node_devices, signals)
            every.extend(last)
            return first, missed

        results["NodeCondition"] = bench.phase(conditions, signals)
        results["NodeCondition"]["all_devices_of_the_node"] = _summary(every, 0)
        audited: list[float] = []

        def evictions() -> tuple[list[float], int]:
            latencies, missed, from_audit = bench.evictions(pods[signals:2 * signals])
            audited.extend(from_audit)
            return latencies, missed

        results["eviction"] = bench.phase(evictions, signals)
        results["eviction"]["audit_patch_to_eviction"] = _summary(audited, 0)
        return results
    finally:
        if records is not None:
            records.stop()
        if operator is not None:
            operator.terminate()
            operator.wait(60)
        cluster.down(options.dir, say=lambda line: print(f"lab: {line}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--signals", type=int, default=30, help="signals per source, one at a time")
    parser.add_argument("--nodes", type=int, default=16, help="kwok nodes of 8 GPUs (enough for 4 x signals)")
    parser.add_argument("--kubernetes", default=cluster.K8S_VERSION, help="the lab's version")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="signals-latency-") as directory:
        print(json.dumps(measure(args.signals, args.nodes, args.kubernetes, Path(directory)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
