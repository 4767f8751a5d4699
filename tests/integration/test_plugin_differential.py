"""explain against kube-scheduler: the verdicts must agree in every scenario (differential.py).

Runs in its own lab (3 nodes of H100, A100 and L4, DeviceTaintRule served through
resource.k8s.io/v1alpha3 with the DRADeviceTaints gate, as on 1.34); about half a minute here.
"""

from __future__ import annotations

import pytest
from kubernetes import config

from .conftest import extra_lab
from .differential import SUMMARY, run_all, scenarios

MIN_SCENARIOS = 60


def test_explain_agrees_with_kube_scheduler(tmp_path_factory: pytest.TempPathFactory) -> None:
    assert len(scenarios()) >= MIN_SCENARIOS
    with extra_lab(tmp_path_factory, nodes=3, gpus_per_node=8, models="H100,A100,L4",
                   presets="device-taints") as lab, \
            config.new_client_from_config(config_file=str(lab.kubeconfig)) as api:
        outcomes = run_all(api, str(lab.kubeconfig))
    agreed = [o for o in outcomes if o.agrees]
    as_built = [o for o in outcomes if o.step_as_built]
    rate = 100.0 * len(agreed) / len(outcomes)
    summary = (f"explain agreed with kube-scheduler in {len(agreed)}/{len(outcomes)} scenarios ({rate:.1f} %); "
               f"it named the step the scenario was built to block in {len(as_built)}/{len(outcomes)}")
    SUMMARY.append(summary)
    print(f"\n{summary}")
    problems = [o.line() for o in outcomes if not (o.agrees and o.step_as_built)]
    assert not problems, "explain and kube-scheduler disagree:\n  " + "\n  ".join(problems)
