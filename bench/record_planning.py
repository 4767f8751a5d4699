"""Benchmark, in-process: the cost of planning one UnhealthyDevice record as the claim count grows.

Planning a record once scanned every claim in the cache (cost: records x claims per resync). It now
asks the claims-by-device index for the device's holders. Both ways run here side by side on the
same synthetic cache (claims each allocated one device of 2,500 nodes x 8 GPUs, a pod per claim).

    .venv/bin/python bench/record_planning.py [--claims 20000] [--records 100]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from claimwarden.cache import Cache
from claimwarden.health.plan import plan_record
from claimwarden.timestamps import now

DRIVER = "gpu.example.com"
NAMESPACE = "claimwarden-system"


def synthetic(claims: int) -> tuple[Cache, list[dict[str, Any]]]:
    by_name: dict[Any, list[Any]] = {}
    by_device: dict[Any, list[Any]] = {}
    pods: dict[Any, list[Any]] = {}
    for i in range(claims):
        pool, device = f"node-{i // 8}", f"gpu-{i % 8}"
        claim = {"metadata": {"name": f"c{i}", "namespace": "ns", "uid": f"c{i}"},
                 "status": {"allocation": {"devices": {"results": [
                     {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]}},
                            "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": f"p{i}"}]}}
        pod = {"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"p{i}"},
               "spec": {"nodeName": pool, "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{i}"}]},
               "status": {"phase": "Running"}}
        by_name[("ns", f"c{i}")] = [claim]
        by_device[(DRIVER, pool, device)] = [("ns", f"c{i}")]
        pods[("ns", f"p{i}")] = [pod]
    indices = {"pods_by_name": pods, "pods_by_claim": {}, "pods_by_template": {}, "claims_by_name": by_name,
               "claims_by_owner": {}, "claims_by_device": by_device, "claims_by_record": {},
               "templates_by_name": {}}
    return Cache(indices), list(by_name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=20000)
    parser.add_argument("--records", type=int, default=100)
    args = parser.parse_args()
    cache, _ = synthetic(args.claims)
    records = [{"metadata": {"name": f"r{i}"}, "spec": {"driver": DRIVER, "pool": f"node-{i}", "device": "gpu-0",
                                                        "effect": "NoExecute"}} for i in range(args.records)]
    moment = now()
    timings = {}
    for way, holders in (("scan every claim", lambda r: list(cache.claims())),
                         ("claims-by-device index", lambda r: cache.claims_holding(
                             (DRIVER, r["spec"]["pool"], r["spec"]["device"])))):
        started = time.perf_counter()
        evictions = sum(len(plan_record(r, holders(r), cache.pods(), moment, NAMESPACE).evict) for r in records)
        timings[way] = (time.perf_counter() - started) / len(records)
        print(f"{way:<24} {timings[way] * 1000:9.3f} ms per record ({evictions} evictions planned)")
    scan, index = timings.values()
    print(f"{args.claims} claims, {args.records} records: the index is {scan / index:.0f}x cheaper per record")


if __name__ == "__main__":
    main()
