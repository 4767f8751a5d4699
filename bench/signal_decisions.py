"""Benchmark, in-process: how fast signals.decide decides, at 1,000 devices (issue 21's "decision latency
<= 100 ms per event at 1k devices").

Every device holds a full record (32 observations: driver taints, pod health, alerts, node conditions)
and a history with clears; the policy is the NVIDIA example's shape (five rules, one with a workload
fault, so every decision also asks the fleet). Each device is decided `--rounds` times, as the controller
does on every event. The fleet is an index of the devices' Unhealthy observations, as the controller keeps
one. Run it against any checkout that has signals/:

    PYTHONPATH=operator .venv/bin/python bench/signal_decisions.py [--devices 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from claimwarden.health.records import DeviceRef
from claimwarden.signals import observations as obs
from claimwarden.signals.decide import History, decide
from claimwarden.signals.fires import Fleet
from claimwarden.signals.observations import Observation
from claimwarden.signals.policy import Policy, Recovery, Rule, Threshold, WorkloadFault

T0 = datetime(2026, 12, 1, tzinfo=UTC)
XID = "gpu.nvidia.com/xid"
POLICY = Policy("bench", drivers=("gpu.nvidia.com",), rules=(
    Rule("fatal-xid", obs.SOURCE_TAINT, XID, ("48", "79", "94", "95"), "NoExecute", "Enforce"),
    Rule("repeated-xid", obs.SOURCE_TAINT, XID, (), "NoSchedule", "Shadow",
         Threshold(5, timedelta(hours=24), timedelta(minutes=3))),
    Rule("fatal-xid-alert", obs.SOURCE_ALERT, "GPUXidError", ("48", "79", "94", "95"), "NoExecute", "Enforce",
         workload_fault=WorkloadFault(3, timedelta(minutes=10))),
    Rule("pod-unhealthy", obs.SOURCE_POD, "allocatedResourcesStatus", ("Unhealthy",), "NoSchedule", "Enforce"),
    Rule("node", obs.SOURCE_NODE, "GPUProblem", ("True",), "NoSchedule", "Shadow")), recovery=Recovery())


def device_observations(n: int) -> list[Observation]:
    """32 observations over two hours, varied by device number (deterministic)."""
    found = []
    for i in range(obs.OBSERVATIONS_MAX):
        at = T0 + timedelta(minutes=4 * i + n % 4)
        kind = (i + n) % 5
        if kind == 0:
            found.append(Observation(obs.SOURCE_TAINT, XID, ("13", "31", "79", "48")[(i + n) % 4], obs.UNHEALTHY,
                                     at, f"{XID}=v@{at.isoformat()}"))
        elif kind == 1:
            found.append(Observation(obs.SOURCE_TAINT, XID, "", obs.HEALTHY, at, f"{XID} removed@{at.isoformat()}"))
        elif kind == 2:
            health = (obs.UNHEALTHY, obs.HEALTHY, obs.UNKNOWN)[(i + n) % 3]
            found.append(Observation(obs.SOURCE_POD, "allocatedResourcesStatus", health, health, at, f"p{i}/c/{n}"))
        elif kind == 3:
            found.append(Observation(obs.SOURCE_ALERT, "GPUXidError", "79" if n % 7 == 0 else "31", obs.UNHEALTHY,
                                     at, f"f{n}@{at.isoformat()}"))
        else:
            found.append(Observation(obs.SOURCE_NODE, "GPUProblem", "False", obs.UNHEALTHY, at, f"node/{at}"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    devices = {DeviceRef("gpu.nvidia.com", f"node-{n // 8}", f"gpu-{n % 8}"): device_observations(n)
               for n in range(args.devices)}
    index: dict[tuple[str, str, str], dict[DeviceRef, list[datetime]]] = defaultdict(lambda: defaultdict(list))
    for ref, seen in devices.items():
        for o in seen:
            if o.state == obs.UNHEALTHY:
                index[(o.source, o.signal, o.value)][ref].append(o.at)

    def fleet(source: str, signal: str, value: str, since: datetime) -> int:
        return sum(1 for times in index[(source, signal, value)].values() if any(at >= since for at in times))

    def constant(source: str, signal: str, value: str, since: datetime) -> int:
        return 1

    for name, counting in (("with the fleet index", fleet), ("fleet answered in O(1)", constant)):
        run(name, devices, counting, args.rounds)


def run(name: str, devices: dict[DeviceRef, list[Observation]], fleet: Fleet, rounds: int) -> None:
    histories = {ref: History(clears=(T0 - timedelta(hours=3),)) for ref in devices}
    now = T0 + timedelta(hours=2, minutes=10)
    latencies: list[float] = []
    effects: dict[str, int] = defaultdict(int)
    started = time.perf_counter()
    for round_ in range(rounds):
        for ref, seen in devices.items():
            began = time.perf_counter()
            decision = decide(POLICY, seen, histories[ref], fleet, now + timedelta(seconds=round_))
            latencies.append(time.perf_counter() - began)
            histories[ref] = decision.history
            effects[decision.effect] += 1
    elapsed = time.perf_counter() - started
    latencies.sort()
    total = len(latencies)
    print(f"{name}: {total} decisions over {len(devices)} devices in {elapsed:.2f} s: "
          f"{total / elapsed:,.0f} decisions/s; per decision mean {statistics.mean(latencies) * 1e3:.3f} ms, "
          f"p50 {latencies[total // 2] * 1e3:.3f} ms, p99 {latencies[int(total * 0.99)] * 1e3:.3f} ms, "
          f"max {latencies[-1] * 1e3:.3f} ms; effects {dict(sorted(effects.items()))}")

if __name__ == "__main__":
    main()
