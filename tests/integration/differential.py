"""The differential test of `explain` against kube-scheduler: the scenarios and their runner.

The cluster (a lab with `--models H100,A100,L4`, 3 nodes x 8 GPUs, DeviceTaintRule served):

- kwok-node-0 has H100s: gpu-0..gpu-5 are held by a running pod's claim (`holder`), 2 are free;
- kwok-node-1 has A100s: gpu-7 is held by a quarantine claim (claimwarden's namespace, record
  label, allocation written by an admin), 7 are free;
- kwok-node-2 has L4s: gpu-4..gpu-7 carry a DeviceTaintRule taint `example.com/flaky=true:NoSchedule`;
- a second DeviceClass `other.example.com` selects a driver that publishes no slices.

Each scenario creates a pod (held back by a scheduling gate) and its claims in its own namespace,
runs explain on that cluster state, removes the gate, waits for kube-scheduler to bind the pod or
report it unschedulable, compares, and cleans up so the next scenario sees the same state.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from claimwarden.cel import Evaluator
from claimwarden.plugin.explain import explain_pod
from claimwarden.plugin.read import Cluster

from .helpers import taint_rule_version

DRIVER = "gpu.example.com"
GATE = "claimwarden.io/differential"
QUARANTINE_NAMESPACE = "claimwarden-system"
TAINT_KEY = "example.com/flaky"
ALLOCATABLE = "allocatable"
SUMMARY: list[str] = []
"""Lines for the end of pytest's report (conftest.py prints them), so CI shows the agreement rate."""

Obj = dict[str, Any]


def attr(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


def cap(name: str) -> str:
    return f'device.capacity["{DRIVER}"].{name}'


MODEL = {m: f'{attr("model")} == "{m}"' for m in ("H100", "A100", "L4", "B100", "Z100")}
OTHER = 'device.attributes["other.example.com"]'



def exactly(selectors: list[str] = (), count: int = 1, *, mode: str = "ExactCount", cls: str = DRIVER,  # type: ignore[assignment]
            tolerations: list[Obj] | None = None) -> Obj:
    body: Obj = {"deviceClassName": cls, "selectors": [{"cel": {"expression": s}} for s in selectors]}
    if mode == "All":
        body["allocationMode"] = "All"
    else:
        body["count"] = count
    if tolerations:
        body["tolerations"] = tolerations
    return body


@dataclass
class Scenario:
    name: str
    expect: str
    """"allocatable", or the explain step the scenario is built to block at."""
    requests: list[Obj] = field(default_factory=list)
    constraints: list[Obj] = field(default_factory=list)
    pod: Obj = field(default_factory=dict)
    extra_claims: list[list[Obj]] = field(default_factory=list)
    """more claims of the same pod, each a list of requests"""


def req(name: str = "gpu", **kwargs: Any) -> Obj:
    return {"name": name, "exactly": exactly(**kwargs)}


def first(name: str, *subs: tuple[str, Obj]) -> Obj:
    return {"name": name, "firstAvailable": [{"name": n, **body} for n, body in subs]}


TOLERATE = [{"key": TAINT_KEY, "operator": "Exists"}]
HOST = "kubernetes.io/hostname"


def scenarios() -> list[Scenario]:
    s = Scenario
    L4_TAINTED = [MODEL["L4"], f'{attr("index")} >= 4']
    return [
        # models, counts and holders
        s("any-1", ALLOCATABLE, [req()]),
        s("h100-1", ALLOCATABLE, [req(selectors=[MODEL["H100"]])]),
        s("h100-2", ALLOCATABLE, [req(selectors=[MODEL["H100"]], count=2)]),
        s("h100-3-held", "count", [req(selectors=[MODEL["H100"]], count=3)]),
        s("a100-7", ALLOCATABLE, [req(selectors=[MODEL["A100"]], count=7)]),
        s("a100-8-quarantine", "count", [req(selectors=[MODEL["A100"]], count=8)]),
        s("l4-4", ALLOCATABLE, [req(selectors=[MODEL["L4"]], count=4)]),
        s("l4-5-tainted", "count", [req(selectors=[MODEL["L4"]], count=5)]),
        s("b100-none", "selectors", [req(selectors=[MODEL["B100"]])]),
        s("any-7", ALLOCATABLE, [req(count=7)]),
        s("any-8", "count", [req(count=8)]),
        s("count-33", "count", [req(count=33)]),
        s("h100-index-low-held", "allocated", [req(selectors=[MODEL["H100"], f'{attr("index")} < 6'])]),
        s("a100-gpu7-quarantined", "allocated", [req(selectors=[MODEL["A100"], f'{attr("index")} == 7'])]),
        s("h100-index-high", ALLOCATABLE, [req(selectors=[MODEL["H100"], f'{attr("index")} >= 6'], count=2)]),
        # capacity and quantities
        s("mem-ge-64Gi", ALLOCATABLE, [req(selectors=[f'{cap("memory")}.compareTo(quantity("64Gi")) >= 0'])]),
        s("mem-ge-64Gi-3", "count", [req(selectors=[f'{cap("memory")}.compareTo(quantity("64Gi")) >= 0'], count=3)]),
        s("mem-gt-100Gi", "selectors", [req(selectors=[f'{cap("memory")}.isGreaterThan(quantity("100Gi"))'])]),
        s("mem-lt-30Gi", ALLOCATABLE, [req(selectors=[f'{cap("memory")}.isLessThan(quantity("30Gi"))'], count=2)]),
        s("mem-eq-40960Mi", ALLOCATABLE, [req(selectors=[f'{cap("memory")} == quantity("40960Mi")'])]),
        s("mem-eq-41Gi", "selectors", [req(selectors=[f'{cap("memory")} == quantity("41Gi")'])]),
        s("compute-gt-100", ALLOCATABLE, [req(selectors=[f'{cap("compute")}.compareTo(quantity("100")) > 0'],
                                              count=3)]),
        s("compute-asInteger", ALLOCATABLE, [req(selectors=[f'{cap("compute")}.asInteger() == 58'])]),
        # semver
        s("semver-gt-0.9", ALLOCATABLE, [req(selectors=[f'{attr("driverVersion")}.isGreaterThan(semver("0.9.0"))'])]),
        s("semver-gt-1.0", "selectors", [req(selectors=[f'{attr("driverVersion")}.isGreaterThan(semver("1.0.0"))'])]),
        s("semver-lt-2", ALLOCATABLE, [req(selectors=[f'{attr("driverVersion")}.isLessThan(semver("2.0.0-rc.1"))'])]),
        s("semver-eq", ALLOCATABLE, [req(selectors=[f'{attr("driverVersion")} == semver("1.0.0")'])]),
        s("semver-major", ALLOCATABLE, [req(selectors=[f'{attr("driverVersion")}.major() == 1'])]),
        s("semver-compare-neg", "selectors",
          [req(selectors=[f'{attr("driverVersion")}.compareTo(semver("1.0.1")) >= 0'])]),
        # CEL semantics and errors
        s("cel-error-missing-attribute", "error", [req(selectors=[f'{attr("nope")} == 1'])]),
        s("cel-error-on-l4-only", "error", [req(selectors=[f'{MODEL["L4"]} && {attr("nope")} == 1'])]),
        s("cel-error-not-absorbed", "error", [req(selectors=[f'{MODEL["H100"]} || {attr("nope")} == 1'])]),
        s("cel-unknown-domain-error", "error", [req(selectors=[f'{OTHER}.model == "x"'])]),
        s("cel-unknown-domain-has", ALLOCATABLE, [req(selectors=[f'!has({OTHER}.model)'])]),
        s("cel-domain-in", "selectors", [req(selectors=['"other.example.com" in device.attributes'])]),
        s("cel-int-vs-double", ALLOCATABLE, [req(selectors=[f'{attr("index")} > 6.5'])]),
        s("cel-startsWith", ALLOCATABLE, [req(selectors=[f'{attr("model")}.startsWith("A")'], count=3)]),
        s("cel-matches", ALLOCATABLE, [req(selectors=[f'{attr("model")}.matches("^L[0-9]+$")'])]),
        s("cel-lowerAscii", ALLOCATABLE, [req(selectors=[f'{attr("model")}.lowerAscii() == "a100"'])]),
        s("cel-bind", ALLOCATABLE, [req(selectors=[f'cel.bind(m, {attr("model")}, m == "H100" || m == "L4")'])]),
        s("cel-uuid-prefix", ALLOCATABLE, [req(selectors=[f'{attr("uuid")}.startsWith("gpu-")'])]),
        # classes
        s("class-no-slices", "class", [req(cls="other.example.com")]),
        s("class-missing", "class", [req(cls="no-such-class.example.com")]),
        # allocationMode All
        s("all-everywhere-blocked", "count", [req(mode="All")]),
        s("all-h100-free-pair", ALLOCATABLE, [req(mode="All", selectors=[MODEL["H100"], f'{attr("index")} >= 6'])]),
        s("all-l4-untainted", ALLOCATABLE, [req(mode="All", selectors=[MODEL["L4"], f'{attr("index")} < 4'])]),
        s("all-l4-tainted", "count", [req(mode="All", selectors=[MODEL["L4"]])]),
        s("all-l4-tolerated", ALLOCATABLE, [req(mode="All", selectors=[MODEL["L4"]], tolerations=TOLERATE)]),
        s("all-a100-quarantine", "count", [req(mode="All", selectors=[MODEL["A100"]])]),
        # firstAvailable
        s("first-b100-h100", ALLOCATABLE, [first("gpu", ("b100", exactly([MODEL["B100"]])),
                                                 ("h100", exactly([MODEL["H100"]])))]),
        s("first-b100-z100", "selectors", [first("gpu", ("b100", exactly([MODEL["B100"]])),
                                                 ("z100", exactly([MODEL["Z100"]])))]),
        s("first-h100x3-a100x3", ALLOCATABLE, [first("gpu", ("h100", exactly([MODEL["H100"]], 3)),
                                                     ("a100", exactly([MODEL["A100"]], 3)))]),
        s("first-h100x3-l4x5", "count", [first("gpu", ("h100", exactly([MODEL["H100"]], 3)),
                                               ("l4", exactly([MODEL["L4"]], 5)))]),
        s("first-tainted-then-a100", ALLOCATABLE, [first("gpu", ("l4", exactly(L4_TAINTED)),
                                                         ("a100", exactly([MODEL["A100"]])))]),
        s("first-tainted-then-held", "allocated",
          [first("gpu", ("l4", exactly(L4_TAINTED)), ("h100", exactly([MODEL["H100"], f'{attr("index")} < 6'])))]),
        # matchAttribute
        s("match-model-2", ALLOCATABLE, [req(count=2)], [{"matchAttribute": f"{DRIVER}/model"}]),
        s("match-index-2", "constraints", [req(count=2)], [{"matchAttribute": f"{DRIVER}/index"}]),
        s("match-two-requests-models", "constraints",
          [req("a", selectors=[MODEL["H100"]]), req("b", selectors=[MODEL["A100"]])],
          [{"matchAttribute": f"{DRIVER}/model"}]),
        s("match-two-requests-ok", ALLOCATABLE, [req("a"), req("b")],
          [{"matchAttribute": f"{DRIVER}/model", "requests": ["a", "b"]}]),
        s("match-version-3", ALLOCATABLE, [req(count=3)], [{"matchAttribute": f"{DRIVER}/driverVersion"}]),
        s("match-missing-attribute", "constraints", [req()], [{"matchAttribute": f"{DRIVER}/nope"}]),
        s("two-requests-two-nodes", "count",
          [req("a", selectors=[MODEL["H100"]]), req("b", selectors=[MODEL["A100"]])]),
        # device taints
        s("taint-untolerated", "taints", [req(selectors=L4_TAINTED)]),
        s("taint-tolerated-exists", ALLOCATABLE, [req(selectors=L4_TAINTED, tolerations=TOLERATE)]),
        s("taint-wrong-value", "taints", [req(selectors=L4_TAINTED, tolerations=[
            {"key": TAINT_KEY, "operator": "Equal", "value": "false"}])]),
        s("taint-effect-noschedule", ALLOCATABLE, [req(selectors=[MODEL["L4"]], count=6, tolerations=[
            {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}])]),
        s("taint-effect-mismatch", "count", [req(selectors=[MODEL["L4"]], count=6, tolerations=[
            {"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}])]),
        s("taint-tolerate-all", ALLOCATABLE,
          [req(selectors=L4_TAINTED, count=4, tolerations=[{"operator": "Exists"}])]),
        # node selection
        s("node-selector-wrong-node", "nodes", [req(selectors=[MODEL["A100"]])],
          pod={"nodeSelector": {HOST: "kwok-node-0"}}),
        s("node-selector-right-node", ALLOCATABLE, [req(selectors=[MODEL["A100"]])],
          pod={"nodeSelector": {HOST: "kwok-node-1"}}),
        s("node-affinity-not-in", "count", [req(count=5)], pod={"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOST, "operator": "NotIn", "values": ["kwok-node-0", "kwok-node-1"]}]}]}}}}),
        s("node-affinity-in-tolerated", ALLOCATABLE, [req(count=8, tolerations=TOLERATE)], pod={"affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOST, "operator": "In", "values": ["kwok-node-2"]}]}]}}}}),
        s("node-selector-no-node", "nodes", [req()], pod={"nodeSelector": {"example.com/rack": "r9"}}),
        # several claims of one pod
        s("two-claims-compete", "count", [req(selectors=[MODEL["H100"]], count=2)],
          extra_claims=[[req(selectors=[MODEL["H100"]])]]),
        s("two-claims-fit", ALLOCATABLE, [req(selectors=[MODEL["A100"]], count=3)],
          extra_claims=[[req(selectors=[MODEL["A100"]], count=3)]]),
    ]


# --- the cluster state ------------------------------------------------------------------------

def _custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def _pod(name: str, claim_names: list[str], extra: Obj, *, gated: bool) -> Obj:
    spec: Obj = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "ctr", "image": "registry.example/busybox:1",
                        "resources": {"claims": [{"name": f"c{i}"} for i in range(len(claim_names))]}}],
        "resourceClaims": [{"name": f"c{i}", "resourceClaimName": n} for i, n in enumerate(claim_names)],
        **extra,
    }
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _claim(name: str, requests: list[Obj], constraints: list[Obj] | None = None, labels: Obj | None = None) -> Obj:
    devices: Obj = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, **({"labels": labels} if labels else {})}, "spec": {"devices": devices}}


def _create_claim(api: client.ApiClient, namespace: str, body: Obj) -> None:
    _custom(api).create_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", body)


def decision(api: client.ApiClient, namespace: str, name: str, timeout: float = 30.0) -> tuple[bool, str]:
    """(bound, message) once kube-scheduler has bound the pod or marked it unschedulable."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.spec.node_name:
            return True, f"bound to {pod.spec.node_name}"
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False" and \
                    condition.reason in ("Unschedulable", "SchedulerError"):
                return False, f"{condition.reason}: {condition.message}"
        time.sleep(0.05)
    raise AssertionError(f"kube-scheduler decided nothing about {namespace}/{name} in {timeout:.0f}s")


def release(api: client.ApiClient, namespace: str, pod: str, claims: list[str]) -> None:
    """Delete the pod and its claims at once, deallocating them first, as a controller would."""
    core, custom = client.CoreV1Api(api), _custom(api)
    try:
        core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
    for claim in claims:
        try:
            body = custom.get_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", claim)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        if (body.get("status") or {}).get("allocation") or (body.get("status") or {}).get("reservedFor"):
            body["status"] = {}
            custom.replace_namespaced_custom_object_status("resource.k8s.io", "v1", namespace, "resourceclaims",
                                                            claim, body)
        custom.patch_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", claim,
                                              {"metadata": {"finalizers": None}})
        try:
            custom.delete_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", claim,
                                                   grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise


@dataclass
class Background:
    namespace: str
    quarantine_claim: str
    rules: list[str]


def prepare(api: client.ApiClient, taint_rule_version: str) -> Background:
    """The shared state every scenario runs against (see the module docstring)."""
    core, custom = client.CoreV1Api(api), _custom(api)
    namespace = f"differential-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": namespace}})
    custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "other.example.com"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "other.example.com"'}}]}})
    _create_claim(api, namespace, _claim("holder", [req(selectors=[MODEL["H100"], f'{attr("index")} < 6'],
                                                        count=6)]))
    core.create_namespaced_pod(namespace, _pod("holder", ["holder"], {}, gated=False))
    bound, message = decision(api, namespace, "holder")
    assert bound, f"the holder pod could not be scheduled: {message}"
    name = f"quarantine-{uuid.uuid4().hex[:5]}"
    _create_claim(api, QUARANTINE_NAMESPACE, _claim(name, [req()], labels={"claimwarden.io/record": name}))
    body = custom.get_namespaced_custom_object("resource.k8s.io", "v1", QUARANTINE_NAMESPACE, "resourceclaims", name)
    body["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "kwok-node-1", "device": "gpu-7"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["kwok-node-1"]}]}]}}}
    custom.replace_namespaced_custom_object_status("resource.k8s.io", "v1", QUARANTINE_NAMESPACE, "resourceclaims",
                                                    name, body)
    rules = []
    for index in range(4, 8):
        rule = f"differential-flaky-l4-{index}"
        custom.create_cluster_custom_object("resource.k8s.io", taint_rule_version, "devicetaintrules", {
            "apiVersion": f"resource.k8s.io/{taint_rule_version}", "kind": "DeviceTaintRule",
            "metadata": {"name": rule},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": "kwok-node-2", "device": f"gpu-{index}"},
                     "taint": {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}}})
        rules.append(rule)
    time.sleep(1.0)  # let kube-scheduler's informers see the quarantine allocation and the rules
    return Background(namespace, name, rules)


def teardown(api: client.ApiClient, background: Background, taint_rule_version: str) -> None:
    custom = _custom(api)
    release(api, background.namespace, "holder", ["holder"])
    release(api, QUARANTINE_NAMESPACE, "-", [background.quarantine_claim])
    for rule in background.rules:
        custom.delete_cluster_custom_object("resource.k8s.io", taint_rule_version, "devicetaintrules", rule)
    custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", "other.example.com")
    client.CoreV1Api(api).delete_namespace(background.namespace)


# --- one scenario -------------------------------------------------------------------------------

@dataclass
class Outcome:
    scenario: Scenario
    scheduler_bound: bool
    scheduler_says: str
    explain_allocatable: bool
    explain_step: str | None
    explain_reason: str
    seconds: float

    @property
    def agrees(self) -> bool:
        return self.scheduler_bound == self.explain_allocatable

    @property
    def step_as_built(self) -> bool:
        if self.scenario.expect == ALLOCATABLE:
            return self.explain_allocatable
        return self.explain_step == self.scenario.expect

    def line(self) -> str:
        verdict = "allocatable" if self.explain_allocatable else f"blocked ({self.explain_step})"
        return (f"{self.scenario.name}: scheduler {'bound' if self.scheduler_bound else 'unschedulable'}; "
                f"explain {verdict}; built for {self.scenario.expect}; {self.explain_reason} | "
                f"scheduler: {self.scheduler_says}")


def run_one(api: client.ApiClient, cluster: Cluster, namespace: str, scenario: Scenario,
            evaluator: Evaluator) -> Outcome:
    start = time.monotonic()
    core = client.CoreV1Api(api)
    base = scenario.name.lower()
    claims = [f"{base}-c0"[:63]]
    _create_claim(api, namespace, _claim(claims[0], scenario.requests, scenario.constraints))
    for number, requests in enumerate(scenario.extra_claims, start=1):
        claims.append(f"{base}-c{number}"[:63])
        _create_claim(api, namespace, _claim(claims[-1], requests))
    pod_name = base[:63]
    core.create_namespaced_pod(namespace, _pod(pod_name, claims, scenario.pod, gated=True))
    try:
        snapshot = cluster.snapshot(pods_namespace=namespace)
        pod = snapshot.pod_index[(namespace, pod_name)]
        explanation = explain_pod(snapshot, pod, evaluator=evaluator)
        core.patch_namespaced_pod(pod_name, namespace, {"spec": {"schedulingGates": None}})
        bound, says = decision(api, namespace, pod_name)
    finally:
        release(api, namespace, pod_name, claims)
    return Outcome(scenario, bound, says, explanation.verdict.allocatable, explanation.verdict.step,
                   explanation.verdict.reason, time.monotonic() - start)


def run_all(api: client.ApiClient, kubeconfig: str, *, say: Callable[[str], None] = print,
            only: Callable[[Scenario], bool] = lambda s: True) -> list[Outcome]:
    version = taint_rule_version(api)
    assert version, "the differential lab must serve DeviceTaintRule (lab preset device-taints)"
    background = prepare(api, version)
    cluster = Cluster(kubeconfig=kubeconfig, context=None)
    evaluator = Evaluator()
    outcomes = []
    try:
        for scenario in [s for s in scenarios() if only(s)]:
            outcome = run_one(api, cluster, background.namespace, scenario, evaluator)
            say(("ok   " if outcome.agrees and outcome.step_as_built else "DIFF ") + outcome.line())
            outcomes.append(outcome)
            wait_claims_gone(api, background.namespace, {"holder"})
    finally:
        cluster.close()
        teardown(api, background, version)
    return outcomes


def wait_claims_gone(api: client.ApiClient, namespace: str, keep: set[str]) -> None:
    """The scheduler must have seen the last scenario's claims go before the next one is judged."""
    custom = _custom(api)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims")["items"]
        if not [i for i in items if i["metadata"]["name"] not in keep]:
            break
        time.sleep(0.05)
    time.sleep(0.15)
