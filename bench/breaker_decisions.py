"""Benchmark, in-process: the cost of the eviction breaker's decisions as the records grow (code review
2a798de, section 9).

N breaker decisions (`HealthController.breakers.decision()`, health/breaker_view.py) over N NoExecute
records of one driver, one claim and pod per record, some records with an eviction in the window
(`--recent`, a fraction of them). A decision is made for every record reconcile and again before every
eviction, so a burst of N marks makes about 2N of them. Run it against any checkout since the breakers
moved to breaker_view.py to compare (the controller's constructor and its `breakers` are all it uses):

    PYTHONPATH=operator .venv/bin/python bench/breaker_decisions.py [--records 500,1000,2000] [--recent 0.1]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from claimwarden.cache import Cache
from claimwarden.health.controller import HealthController
from claimwarden.timestamps import format_rfc3339, now

DRIVER = "gpu.example.com"
NAMESPACE = "claimwarden-system"


def synthetic(records: int, recent: float) -> Cache:
    claims: dict[Any, list[Any]] = {}
    by_device: dict[Any, list[Any]] = {}
    pods: dict[Any, list[Any]] = {}
    bodies: dict[Any, list[Any]] = {}
    every = round(1 / recent) if recent > 0 else 0
    at = format_rfc3339(now())
    for i in range(records):
        pool, device = f"node-{i // 8}", f"gpu-{i % 8}"
        claims[("ns", f"c{i}")] = [{"metadata": {"name": f"c{i}", "namespace": "ns", "uid": f"c{i}"},
                                    "status": {"allocation": {"devices": {"results": [
                                        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]}},
                                        "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": f"p{i}"}]}}]
        by_device[(DRIVER, pool, device)] = [("ns", f"c{i}")]
        pods[("ns", f"p{i}")] = [{"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"p{i}"},
                                  "spec": {"nodeName": pool, "resourceClaims": [{"name": "gpu",
                                                                                 "resourceClaimName": f"c{i}"}]},
                                  "status": {"phase": "Running"}}]
        status: dict[str, Any] = {}
        if every and i % every == 0:
            status["recentEvictions"] = [{"pod": f"ns/gone-{i}", "at": at}]
        bodies[f"r{i}"] = [{"metadata": {"name": f"r{i}", "resourceVersion": str(i + 1)},
                            "spec": {"driver": DRIVER, "pool": pool, "device": device, "effect": "NoExecute"},
                            "status": status}]
    return Cache({"pods_by_name": pods, "pods_by_claim": {}, "pods_by_template": {}, "claims_by_name": claims,
                  "claims_by_owner": {}, "claims_by_device": by_device, "claims_by_record": {},
                  "templates_by_name": {}, "records_by_name": bodies, "records_by_device": {}})


def run(records: int, recent: float) -> tuple[float, Any]:
    controller = HealthController(synthetic(records, recent), kube=None, namespace=NAMESPACE)  # type: ignore[arg-type]
    started = time.perf_counter()
    for _ in range(records):
        decision = controller.breakers.decision(DRIVER)
    return time.perf_counter() - started, decision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="500,1000,2000", help="comma-separated record counts")
    parser.add_argument("--recent", type=float, default=0.1, help="fraction of records with an eviction in the window")
    args = parser.parse_args()
    for records in (int(n) for n in args.records.split(",")):
        elapsed, decision = run(records, args.recent)
        print(f"{records:>6} records: {records} decisions in {elapsed:7.3f} s ({elapsed / records * 1e6:8.1f} us each;"
              f" population {decision.population}, recent {decision.recent}, limit {decision.limit})")


if __name__ == "__main__":
    main()
