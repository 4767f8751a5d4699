"""How many alerts a second the Alertmanager webhook takes in, in-process: the receiver on 127.0.0.1, a sink
that only collects, one alert a call (the shipped route groups by GPU and XID), over --nodes x --devices GPUs.

Measures the receiver alone (authentication, parsing, dedup, device resolution), not the records' writes:
once by the `dra_*` labels, once by `UUID` + `Hostname` (a walk over the slices).

    .venv/bin/python bench/webhook_speed.py [--nodes 125] [--devices 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from claimwarden.health.records import DeviceRef
from claimwarden.signals.alerts import Alert, resolve_device
from claimwarden.signals.observations import Observation
from claimwarden.signals.webhook import Receiver, WebhookSettings

DRIVER = "gpu.example.com"
TOKEN = "bench-token"


def slices(nodes: int, devices: int) -> list[dict[str, Any]]:
    return [{"spec": {"driver": DRIVER, "nodeName": f"node-{n}", "pool": {"name": f"node-{n}", "generation": 1},
                      "devices": [{"name": f"gpu-{d}", "attributes": {"uuid": {"string": f"GPU-{n}-{d}"}}}
                                  for d in range(devices)]}} for n in range(nodes)]


def alerts(nodes: int, devices: int, by_uuid: bool) -> list[dict[str, Any]]:
    result = []
    for n in range(nodes):
        for d in range(devices):
            labels = {"alertname": "GPUXidError", "xid": "79"}
            if by_uuid:
                labels |= {"UUID": f"GPU-{n}-{d}", "Hostname": f"node-{n}"}
            else:
                labels |= {"dra_driver_name": DRIVER, "dra_pool_name": f"node-{n}", "dra_device_name": f"gpu-{d}"}
            result.append({"status": "firing", "labels": labels, "annotations": {},
                           "startsAt": "2026-12-02T10:00:00Z", "fingerprint": f"{n}-{d}-{by_uuid}"})
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(nodes: int, devices: int, by_uuid: bool, token_file: Path) -> tuple[int, float]:
    written: list[tuple[DeviceRef, Observation]] = []
    inventory = slices(nodes, devices)

    async def sink(pairs: list[tuple[DeviceRef, Observation]]) -> None:
        written.extend(pairs)

    def resolve(alert: Alert) -> DeviceRef | None:
        return resolve_device(alert, inventory)

    settings = WebhookSettings(address="127.0.0.1", port=free_port(), token_file=str(token_file), rate=1e9,
                               burst=10**9)
    receiver = Receiver(settings, sink, resolve, lambda: True)
    await receiver.start()
    try:
        async with aiohttp.ClientSession() as session:
            started = time.perf_counter()
            for alert in alerts(nodes, devices, by_uuid):
                async with session.post(receiver.url, data=json.dumps({"version": "4", "alerts": [alert]}),
                                        headers={"Authorization": f"Bearer {TOKEN}"}) as response:
                    assert response.status == 200, await response.text()
            return len(written), time.perf_counter() - started
    finally:
        await receiver.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        token_file = Path(directory) / "token"
        token_file.write_text(TOKEN + "\n")
        for by_uuid in (False, True):
            count, seconds = asyncio.run(run(args.nodes, args.devices, by_uuid, token_file))
            way = "UUID + Hostname" if by_uuid else "dra_* labels"
            print(f"{way:>15}: {count} alerts on {args.nodes} x {args.devices} GPUs, one a call, in {seconds:.2f} s: "
                  f"{count / seconds:.0f}/s, {seconds / count * 1000:.2f} ms each")


if __name__ == "__main__":
    main()
