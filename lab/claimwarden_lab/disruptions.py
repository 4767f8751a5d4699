"""What a control plane goes through on a long-lived cluster, done to the lab on purpose: an apiserver or
etcd restarted by PID, etcd compacted (the chaos suite, the re-list tests and `claimwarden lab restart`)."""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .cluster import START_TIMEOUT, LabState, Say
from .processes import LabError, Process, http_ok, restart, start, stop, wait_until


def _process(state: LabState, name: str) -> tuple[int, Process]:
    for index, proc in enumerate(state.processes):
        if proc.name == name:
            return index, proc
    raise LabError(f"the lab in {state.dir} has no {name} process; run 'claimwarden lab up' first")


def restart_apiserver(state: LabState, say: Say = print, *, runtime_config: str | None = None) -> Process:
    """Stop kube-apiserver by PID, start it again with the same arguments, wait for /readyz.

    Clients see what they see when a control-plane node restarts: broken watches, then re-lists.
    `runtime_config`, when given, replaces its --runtime-config, so that it serves other API versions
    afterwards (as an upgrade that drops an alpha version does).
    """
    index, old = _process(state, "kube-apiserver")
    _, etcd = _process(state, "etcd")
    if runtime_config is not None:
        argv = [arg for arg in old.argv if not arg.startswith("--runtime-config=")]
        old = dataclasses.replace(old, argv=[*argv, f"--runtime-config={runtime_config}"] if runtime_config else argv)
    say(f"restarting kube-apiserver (pid {old.pid})")
    new = restart(old)
    state.processes[index] = new
    state.save()
    ca = str(state.dir / "pki" / "ca.crt")
    wait_until("kube-apiserver /readyz", lambda: http_ok(f"{state.api_url}/readyz", ca), START_TIMEOUT, [etcd, new])
    say(f"kube-apiserver ready again (pid {new.pid})")
    return new


def restart_etcd(state: LabState, say: Say = print, *, down: float = 0.0) -> Process:
    """Stop etcd by PID, leave it down for ``down`` seconds, start it again on its data, wait until the
    apiserver is ready again.

    Its data directory is kept, so nothing is lost: clients see what an etcd member's restart shows them,
    requests failing (the apiserver answers 5xx or times out) and then going through; watches whose
    resourceVersion etcd still has resume.
    """
    index, old = _process(state, "etcd")
    _, apiserver = _process(state, "kube-apiserver")
    if not old.argv:
        raise LabError(f"etcd was started by an older claimwarden that did not record its command line; run "
                       f"'claimwarden lab down --dir {state.dir}' and 'lab up' again")
    say(f"stopping etcd (pid {old.pid}) for {down:g} s")
    stop(old)
    time.sleep(down)
    new = start(old.name, old.argv, Path(old.log).parent, old.env)
    state.processes[index] = new
    state.save()
    wait_until("etcd /health", lambda: http_ok(f"http://127.0.0.1:{state.ports['etcd']}/health"),
               START_TIMEOUT, [new])
    ca = str(state.dir / "pki" / "ca.crt")
    wait_until("kube-apiserver /readyz", lambda: http_ok(f"{state.api_url}/readyz", ca), START_TIMEOUT,
               [new, apiserver])
    say(f"etcd ready again (pid {new.pid})")
    return new


def _etcd_post(state: LabState, path: str, body: dict[str, Any]) -> dict[str, Any]:
    url = f"http://127.0.0.1:{state.ports['etcd']}{path}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise LabError(f"etcd's HTTP gateway at {url} failed: {exc}") from None


def compact_etcd(state: LabState) -> int:
    """Compact etcd to its current revision (physically) through its HTTP gateway; return that revision.

    Afterwards a watch or list from any older resourceVersion gets 410 Gone, as on a long-lived cluster.
    """
    header = _etcd_post(state, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()}).get("header") or {}
    revision = int(header.get("revision") or 0)
    if revision <= 0:
        raise LabError(f"etcd did not report its current revision (header: {header})")
    _etcd_post(state, "/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision
