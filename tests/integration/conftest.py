"""One lab per test session, started through the same code as `claimwarden lab up`.

If the binaries are missing or the lab cannot start, every integration test fails with the
reason. They never skip: a skipped suite hides exactly the breakage CI exists to catch.

After every test the auditor (auditor.py, the autouse `audit` fixture) checks what claimwarden
did on the way; `extra_lab` audits its lab before stopping it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from claimwarden_lab import binaries, cluster
from claimwarden_lab.processes import LabError

from .auditor import Audit, LabAudit, LogWatch, Rules, leftovers, read_objects, rules_from, shared_devices
from .helpers import delete_namespace
from .operator import Operator, log_paths

_LAB_ERROR: list[str] = []
CRDS = Path(__file__).resolve().parents[2] / "crds"


BASE = Path(__file__).resolve().parents[2] / "manifests" / "base"
APPROVAL = Path(__file__).resolve().parents[2] / "manifests" / "approval"
SERVICE_ACCOUNT = ("claimwarden-system", "claimwarden")


def install_crds(state: cluster.LabState) -> None:
    """Install what claimwarden needs as a user would: the CRDs, the approval policy, its namespace,
    ServiceAccount and RBAC.

    claimwarden then runs in every integration test as that ServiceAccount (a real token from the
    TokenRequest API), so the suites prove the ClusterRole is enough.
    """
    kubectl = [f"{state.bin_dir}/kubectl", f"--kubeconfig={state.kubeconfig}"]
    subprocess.run([*kubectl, "apply", "-k", str(CRDS)], check=True, capture_output=True)
    subprocess.run([*kubectl, "apply", "-k", str(APPROVAL)], check=True, capture_output=True)
    for name in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "leader-election-rbac.yaml"):
        subprocess.run([*kubectl, "apply", "-f", str(BASE / name)], check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                    "crd/unhealthydevices.claimwarden.io", "crd/healthpolicies.claimwarden.io"],
                   check=True, capture_output=True)


def service_account_kubeconfig(state: cluster.LabState) -> Path:
    """A kubeconfig holding a token of claimwarden's ServiceAccount (created once per lab)."""
    path = state.dir / "claimwarden.kubeconfig"
    if path.exists():
        return path
    namespace, name = SERVICE_ACCOUNT
    with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
        request = client.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, body={
            "spec": {"audiences": [], "expirationSeconds": 86400}})
    return token_kubeconfig(state, path, request.status.token)


def token_kubeconfig(state: cluster.LabState, path: Path, token: str) -> Path:
    """Write a kubeconfig for the lab that authenticates with `token`."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "claimwarden",
        "clusters": [{"name": "lab", "cluster": {"server": state.api_url,
                                                 "certificate-authority": str(state.dir / "pki" / "ca.crt")}}],
        "users": [{"name": "claimwarden", "user": {"token": token}}],
        "contexts": [{"name": "claimwarden", "context": {"cluster": "lab", "user": "claimwarden"}}]}))
    return path


def lab_kubernetes() -> str:
    """The Kubernetes version the suite's labs run: $CLAIMWARDEN_KUBERNETES (1.34 to 1.37), else the default."""
    return os.environ.get("CLAIMWARDEN_KUBERNETES") or binaries.K8S_VERSION


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LabState]:
    if _LAB_ERROR:
        pytest.fail(_LAB_ERROR[0], pytrace=False)
    directory = tmp_path_factory.mktemp("lab") / "cluster"
    options = cluster.LabOptions(dir=directory, nodes=2, gpus_per_node=8, kubernetes=lab_kubernetes())
    try:
        state = cluster.up(options, say=lambda line: print(f"lab: {line}"))
    except LabError as exc:
        _LAB_ERROR.append(f"the lab could not start: {exc}")
        pytest.fail(_LAB_ERROR[0], pytrace=False)
    try:
        install_crds(state)
        yield state
    finally:
        if os.environ.get("CLAIMWARDEN_KEEP_LAB"):
            print(f"lab kept running in {directory} (CLAIMWARDEN_KEEP_LAB)")
        else:
            cluster.down(directory, say=lambda line: print(f"lab: {line}"))


@pytest.fixture(scope="session")
def api(lab: cluster.LabState) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(lab.kubeconfig))
    yield api_client
    api_client.close()


@pytest.fixture
def namespace(api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    base = request.node.name.lower().replace("_", "-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    client.CoreV1Api(api).create_namespace(body={"metadata": {"name": name}})
    yield name
    delete_namespace(api, name)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Results that CI should show even when they pass, e.g. explain's agreement rate with kube-scheduler."""
    from .differential import SUMMARY

    for line in SUMMARY:
        terminalreporter.write_line(line)


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def audit(request: pytest.FixtureRequest) -> Iterator[Audit | None]:
    """Fail the test if claimwarden did something it should not have on the way (auditor.py).

    Autouse, so it is set up before and torn down after `namespace`: it sees the namespace gone.
    Tests on an extra lab only get the log rule here; `extra_lab` audits the rest.
    """
    marker = request.node.get_closest_marker("audit")
    try:
        rules = rules_from(marker.kwargs if marker else {})
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    logs = LogWatch(log_paths)
    auditor = None
    if "lab" in request.fixturenames:
        auditor = Audit(request.getfixturevalue("lab"), request.getfixturevalue("api"), logs)
    yield auditor
    if auditor is None:
        problems = logs.check(rules)
    elif request.node.stash.get(_CALL_FAILED, False):
        problems = auditor.lab.check_events(rules) + logs.check(rules)  # the objects are whatever the failure left
    else:
        funcargs = getattr(request.node, "funcargs", None) or {}
        problems = auditor.check(rules, namespace=funcargs.get("namespace"))
    if problems:
        pytest.fail("the auditor found what claimwarden should not have done "
                    "(see tests/integration/auditor.py):\n  " + "\n  ".join(problems), pytrace=False)


@pytest.fixture
def lab_dir(lab: cluster.LabState) -> Path:
    return lab.dir


@pytest.fixture(scope="session")
def operator_process(lab: cluster.LabState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """One claimwarden for the session, started on first use; tests may stop or kill it."""
    log = tmp_path_factory.mktemp("claimwarden") / "claimwarden.log"
    process = Operator(service_account_kubeconfig(lab), log)
    yield process
    code = process.stop()
    assert code in (None, 0), f"claimwarden exited with {code} at the end of the session"


@pytest.fixture
def claimwarden(operator_process: Operator) -> Operator:
    operator_process.start()
    return operator_process


@contextlib.contextmanager
def extra_lab(tmp_path_factory: pytest.TempPathFactory, rules: Rules | None = None, install: bool = True,
              **options: Any) -> Iterator[cluster.LabState]:
    """A second lab for tests that need other options or more devices; stopped afterwards.

    Its audit covers the lab's whole life: a module that reuses the same devices in several tests
    passes `rules` with a higher `max_writes` (and says why). install=False leaves out what install_crds
    installs, for a test that installs claimwarden itself (test_helm.py: Helm refuses to take over objects
    that kubectl created)."""
    directory = tmp_path_factory.mktemp("extra-lab") / "cluster"
    try:
        options.setdefault("kubernetes", lab_kubernetes())
        state = cluster.up(cluster.LabOptions(dir=directory, **options), say=lambda line: print(f"lab: {line}"))
    except LabError as exc:
        pytest.fail(f"the extra lab could not start: {exc}", pytrace=False)
    lab_audit = LabAudit(state, from_start=True)
    problems: list[str] = []
    try:
        if install:
            install_crds(state)
        yield state
        problems = lab_audit.check_events(rules or Rules())
        with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
            objects = read_objects(api)
        problems += shared_devices(objects.claims) + leftovers(objects)
    finally:
        cluster.down(directory, say=lambda line: print(f"lab: {line}"))
    if problems:
        pytest.fail(f"the auditor found in the extra lab {directory}:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def image() -> str:
    """claimwarden's image, built once per session with podman (test_image.py, test_real_node.py)."""
    from .test_image import build_image

    return build_image()


@pytest.fixture(scope="session")
def signals_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LabState]:
    """One lab for the signals' tests (test_signals_*.py): driver taints (the device-taints preset) and
    KEP-4680 pod health (gate ResourceHealthStatus, on by default from 1.36) served; audited over its life."""
    gates = "ResourceHealthStatus=true" if lab_kubernetes() < "1.36" else ""
    with extra_lab(tmp_path_factory, Rules(max_writes=SIGNALS_MAX_WRITES), nodes=1, gpus_per_node=8,
                   presets="device-taints", feature_gates=gates) as state:
        yield state


SIGNALS_MAX_WRITES = 40
"""Writes per object over the signals lab's life: its tests reuse one node's devices and each test writes a
device's signal record a few times (created, status, spec, recovered, deleted)."""


@pytest.fixture(scope="session")
def signals_operator(signals_lab: cluster.LabState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    process = Operator(service_account_kubeconfig(signals_lab),
                       tmp_path_factory.mktemp("signals") / "claimwarden.log")
    process.start()
    yield process
    code = process.stop()
    assert code in (None, 0), f"claimwarden exited with {code} at the end of the signals session"


@pytest.fixture
def signals_api(signals_lab: cluster.LabState) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(signals_lab.kubeconfig))
    yield api_client
    api_client.close()


@pytest.fixture
def signals_namespace(signals_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the signals lab with the claim template single-gpu; deleted (and waited for) afterwards."""
    from .helpers import template

    name = request.node.name.lower().replace("_", "-")[:40].strip("-")
    client.CoreV1Api(signals_api).create_namespace(body={"metadata": {"name": name}})
    client.ResourceV1Api(signals_api).create_namespaced_resource_claim_template(name, body=template("single-gpu"))
    yield name
    delete_namespace(signals_api, name)
