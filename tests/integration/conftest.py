"""One lab per test session, started through the same code as `claimwarden lab up`.

If the binaries are missing or the lab cannot start, every integration test fails with the
reason. They never skip: a skipped suite hides exactly the breakage CI exists to catch.
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
from kubernetes import client, config

from claimwarden.lab import cluster
from claimwarden.lab.processes import LabError

from .helpers import delete_namespace
from .operator import Operator

_LAB_ERROR: list[str] = []
CRDS = Path(__file__).resolve().parents[2] / "crds"


def install_crds(state: cluster.LabState) -> None:
    """`kubectl apply -f crds/`, as a user installs claimwarden's CRDs, then wait until they serve."""
    kubectl = [f"{state.bin_dir}/kubectl", f"--kubeconfig={state.kubeconfig}"]
    subprocess.run([*kubectl, "apply", "-f", str(CRDS)], check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                    "crd/unhealthydevices.claimwarden.io"], check=True, capture_output=True)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LabState]:
    if _LAB_ERROR:
        pytest.fail(_LAB_ERROR[0], pytrace=False)
    directory = tmp_path_factory.mktemp("lab") / "cluster"
    options = cluster.LabOptions(dir=directory, nodes=2, gpus_per_node=8)
    try:
        state = cluster.up(options, say=lambda line: print(f"lab: {line}"))
    except LabError as exc:
        _LAB_ERROR.append(f"the lab could not start: {exc}")
        pytest.fail(_LAB_ERROR[0], pytrace=False)
    install_crds(state)
    try:
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


@pytest.fixture
def lab_dir(lab: cluster.LabState) -> Path:
    return lab.dir


@pytest.fixture(scope="session")
def operator_process(lab: cluster.LabState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """One claimwarden for the session, started on first use; tests may stop or kill it."""
    log = tmp_path_factory.mktemp("claimwarden") / "claimwarden.log"
    process = Operator(lab.kubeconfig, log)
    yield process
    code = process.stop()
    assert code in (None, 0), f"claimwarden exited with {code} at the end of the session"


@pytest.fixture
def claimwarden(operator_process: Operator) -> Operator:
    operator_process.start()
    return operator_process


@contextlib.contextmanager
def extra_lab(tmp_path_factory: pytest.TempPathFactory, **options: Any) -> Iterator[cluster.LabState]:
    """A second lab for tests that need other options or more devices; stopped afterwards."""
    directory = tmp_path_factory.mktemp("extra-lab") / "cluster"
    try:
        state = cluster.up(cluster.LabOptions(dir=directory, **options), say=lambda line: print(f"lab: {line}"))
    except LabError as exc:
        pytest.fail(f"the extra lab could not start: {exc}", pytrace=False)
    install_crds(state)
    try:
        yield state
    finally:
        cluster.down(directory, say=lambda line: print(f"lab: {line}"))
