"""`claimwarden lab restart-apiserver --compact`: old resourceVersions are gone, and the lab works again.

On a lab of its own, so that the session's claimwarden never sees its apiserver go away.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kubernetes import client, config

from claimwarden_lab import cluster
from claimwarden_lab.processes import is_running

from .conftest import extra_lab
from .helpers import kubectl, wait_for


def test_compaction_and_restart_expire_old_resource_versions(tmp_path_factory: pytest.TempPathFactory) -> None:
    with extra_lab(tmp_path_factory, nodes=1, gpus_per_node=1) as state:
        api = config.new_client_from_config(config_file=str(state.kubeconfig))
        core = client.CoreV1Api(api)
        try:
            old = core.create_namespaced_config_map("default", body={"metadata": {"name": "before"}})
            old_rv = old.metadata.resource_version
            core.create_namespaced_config_map("default", body={"metadata": {"name": "after"}})
            before = {p.name: p for p in state.processes}

            result = subprocess.run([sys.executable, "-m", "claimwarden", "lab", "restart-apiserver", "--compact",
                                     "--dir", str(state.dir)], capture_output=True, text=True, timeout=180)
            assert result.returncode == 0, result.stderr
            assert "etcd compacted to revision" in result.stdout and "kube-apiserver ready again" in result.stdout

            after = cluster.LabState.load(state.dir)
            assert after is not None and after.ready
            apiserver = next(p for p in after.processes if p.name == "kube-apiserver")
            assert apiserver.pid != before["kube-apiserver"].pid and is_running(apiserver)
            assert apiserver.argv == before["kube-apiserver"].argv and "--audit-log-mode=blocking" in apiserver.argv
            assert not is_running(before["kube-apiserver"])
            assert all(p.pid == before[p.name].pid for p in after.processes if p.name != "kube-apiserver")

            # A watch from before the compaction: the apiserver answers with an ERROR event, 410 Gone.
            raw = kubectl(state.bin_dir, str(state.kubeconfig), "get", "--raw",
                          f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={old_rv}&timeoutSeconds=5")
            event = json.loads(raw.splitlines()[0])
            assert event["type"] == "ERROR" and event["object"]["code"] == 410, raw

            # The lab works again: writes, scheduling and kwok's kubelets.
            core.create_namespaced_config_map("default", body={"metadata": {"name": "later"}})
            core.create_namespaced_pod("default", body={"metadata": {"name": "after-restart"}, "spec": {
                "terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "registry.example/x:1"}]}})
            wait_for("a pod Running after the restart", lambda: core.read_namespaced_pod(
                "after-restart", "default").status.phase == "Running", 60)
        finally:
            api.close()

