"""The auditor: what else claimwarden did while a test got the outcome it expected.

Tests check the outcome they expect; a hot loop that patches a claim 500 times, a pod evicted
twice, a swallowed traceback or a quarantine claim left behind pass them all. The auditor runs
after every integration test (the autouse `audit` fixture in conftest.py) and fails the test when
it finds one of these:

- **hot object**: claimwarden wrote one object more than `max_writes` times (default 20) during
  the test. Writes are counted from the lab apiserver's audit log (`LabState.audit_log`), a real
  apiserver feature, per (group, resource, namespace, name); subresources such as `status` count
  toward their object, evictions are counted on their own.
- **evicted twice**: a pod (namespace, name) was evicted (HTTP 201) more than once.
- **log**: claimwarden's log has a traceback or an ERROR/CRITICAL line the test did not expect.
  Every `Operator` registers its log file (operator.py), and only the bytes written during the
  test are read.
- **leftover**: once the test's namespace is gone, claimwarden's objects that nothing justifies
  any more: a quarantine claim whose device no record marks, a record from an annotation that no slice
  carries any more, a DeviceTaintRule without its record, and any quarantine claim, record or
  DeviceTaintRule that appeared during the test and is still there.
- **shared device**: two claims other than claimwarden's quarantine claims are allocated the same
  device (results with `adminAccess: true` may share and are skipped); or two quarantine claims are
  (a device has one, whichever records mark it).
- **stale reservation**: a claim's `reservedFor` names a pod that has been gone (or replaced by
  another UID) for more than 10 s.

A test may change what the auditor accepts, and must say why:

    @pytest.mark.audit(max_writes=50, reason="...")          # a higher bound per object
    @pytest.mark.audit(expect_log=[r"regex"], reason="...")  # log lines it provokes on purpose
    @pytest.mark.audit(leftovers=False, reason="...")        # it leaves objects behind on purpose

The rule functions are pure (plain dicts in, messages out) so tests/unit/test_auditor_rules.py
proves each one fires; `Audit` and `LabAudit` are the shell that reads the lab.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from claimwarden_lab.cluster import LabState

DEFAULT_MAX_WRITES = 20
STALE_RESERVATION_SECONDS = 10.0
CONVERGE_SECONDS = 30.0
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
QUARANTINE_NAMESPACE = "claimwarden-system"
RECORD_LABEL = "claimwarden.io/record"
ANNOTATION_PREFIX = "unhealthy.claimwarden.io/"
RULE_PREFIX = "claimwarden-"
DRIVER_ANNOTATION_SOURCE = "annotation"
SIBLING_SOURCE = "sibling"

_LOG_ERROR = re.compile(r"\[(ERROR|CRITICAL)\s*\]|\"(levelname|severity|level)\":\s*\"(error|critical)\"", re.I)
_LOG_RECORD_START = re.compile(r"^\[?\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}|^\{")
_TRACEBACK = "Traceback (most recent call last)"

Object = dict[str, Any]


# --- what a test may change -----------------------------------------------------------------

@dataclass(frozen=True)
class Rules:
    max_writes: int = DEFAULT_MAX_WRITES
    expect_log: tuple[str, ...] = ()
    leftovers: bool = True


def rules_from(kwargs: Mapping[str, Any]) -> Rules:
    """The Rules of a `@pytest.mark.audit(...)` marker's keyword arguments; a change needs a reason."""
    unknown = set(kwargs) - {"max_writes", "expect_log", "leftovers", "reason"}
    if unknown:
        raise ValueError(f"@pytest.mark.audit: unknown argument(s) {sorted(unknown)}")
    rules = Rules(max_writes=int(kwargs.get("max_writes", DEFAULT_MAX_WRITES)),
                  expect_log=tuple(kwargs.get("expect_log", ())), leftovers=bool(kwargs.get("leftovers", True)))
    if rules != Rules() and not str(kwargs.get("reason", "")).strip():
        raise ValueError("@pytest.mark.audit changes what the auditor accepts: give reason='why'")
    return rules


# --- rules over audit events --------------------------------------------------------------------

def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _completed(events: Iterable[Object]) -> list[Object]:
    return [e for e in events if e.get("stage", "ResponseComplete") == "ResponseComplete"]


def _is_eviction(event: Mapping[str, Any]) -> bool:
    ref = event.get("objectRef") or {}
    return bool(event.get("verb") == "create" and ref.get("resource") == "pods"
                and ref.get("subresource") == "eviction")


def _is_lease(event: Mapping[str, Any]) -> bool:
    """The leader's Lease: renewed every retry period by design, so never a hot loop."""
    ref = event.get("objectRef") or {}
    return bool(ref.get("apiGroup") == "coordination.k8s.io" and ref.get("resource") == "leases")


def hot_objects(events: Iterable[Object], *, user: str = CLAIMWARDEN_USER,
                bound: int = DEFAULT_MAX_WRITES) -> list[str]:
    """Objects that ``user`` wrote more than ``bound`` times (evictions and unnamed creates left out)."""
    counts: dict[tuple[str, str, str, str], Counter[str]] = defaultdict(Counter)
    for event in _completed(events):
        ref = event.get("objectRef") or {}
        if ((event.get("user") or {}).get("username") != user or event.get("verb") not in WRITE_VERBS
                or _is_eviction(event) or not ref.get("name") or _is_lease(event)):
            continue  # a create with generateName has no name yet: each one is a new object
        key = (ref.get("apiGroup") or "", ref.get("resource") or "", ref.get("namespace") or "", ref["name"])
        what = event["verb"] + (f" {ref['subresource']}" if ref.get("subresource") else "")
        counts[key][what] += 1
    problems = []
    for (group, resource, namespace, name), by_verb in sorted(counts.items()):
        total = sum(by_verb.values())
        if total > bound:
            kind = f"{resource}.{group}" if group else resource
            where = f"{namespace}/{name}" if namespace else name
            detail = ", ".join(f"{n} {verb}" for verb, n in by_verb.most_common())
            problems.append(f"hot object: claimwarden wrote {kind} {where} {total} times (bound {bound}): {detail}")
    return problems


def repeated_evictions(events: Iterable[Object]) -> list[str]:
    """Pods (namespace, name) evicted successfully more than once, by anyone."""
    evicted: Counter[tuple[str, str]] = Counter()
    who: dict[tuple[str, str], set[str]] = defaultdict(set)
    for event in _completed(events):
        if _is_eviction(event) and (event.get("responseStatus") or {}).get("code") == 201:
            ref = event["objectRef"]
            key = (ref.get("namespace") or "", ref.get("name") or "")
            evicted[key] += 1
            who[key].add((event.get("user") or {}).get("username") or "?")
    return [f"evicted twice: pod {ns}/{name} was evicted {n} times (by {', '.join(sorted(who[(ns, name)]))})"
            for (ns, name), n in sorted(evicted.items()) if n > 1]


# --- rule over claimwarden's log --------------------------------------------------------------

def log_problems(lines: Iterable[str], *, expected: Sequence[str] = (), source: str = "claimwarden's log") -> list[str]:
    """Tracebacks and ERROR/CRITICAL lines that no ``expected`` regex matches.

    A traceback that follows an expected log line belongs to it and is expected too. A traceback is
    reported whole (up to 40 lines), with the log line before it.
    """
    patterns = [re.compile(p) for p in expected]
    problems = []
    record, record_expected = "", False
    block: list[str] | None = None
    end = "\0end"
    for line in [*lines, end]:
        starts_record = bool(_LOG_RECORD_START.search(line))
        if block is not None and (starts_record or line is end):
            problems.append(f"log: a traceback in {source} after {record.strip()[:200]!r}:\n      "
                            + "\n      ".join(block[:40]))
            block = None
        is_expected = any(p.search(line) for p in patterns)
        if block is not None:  # chained exceptions ("During handling ...") stay in one block
            block.append(line.rstrip())
        elif _TRACEBACK in line:
            if not (record_expected or is_expected):
                block = [line.rstrip()]
        elif starts_record:
            record, record_expected = line, is_expected
            if _LOG_ERROR.search(line) and not is_expected:
                problems.append(f"log: an unexpected error in {source}: {line.strip()[:300]}")
        elif _LOG_ERROR.search(line) and not is_expected:
            problems.append(f"log: an unexpected error in {source}: {line.strip()[:300]}")
    return problems


# --- rules over the objects in the lab ----------------------------------------------------------

def is_quarantine_claim(claim: Mapping[str, Any]) -> bool:
    meta = _meta(claim)
    return meta.get("namespace") == QUARANTINE_NAMESPACE and RECORD_LABEL in (meta.get("labels") or {})


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def shared_devices(claims: Iterable[Object]) -> list[str]:
    """Devices allocated to two or more claims that are not quarantine claims (admin access aside), and devices
    allocated to two or more quarantine claims (one per device, whichever records mark it)."""
    holders: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    parked: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for claim in claims:
        meta = _meta(claim)
        for result in _results(claim):
            if result.get("adminAccess"):
                continue
            key = (result.get("driver") or "", result.get("pool") or "", result.get("device") or "")
            found = parked if is_quarantine_claim(claim) else holders
            found[key].append(f"{meta.get('namespace')}/{meta.get('name')}")
    return [f"shared device: {'/'.join(key)} is allocated to {len(names)} claims: {', '.join(sorted(names))}"
            for key, names in sorted(holders.items()) if len(set(names)) > 1] + [
        f"quarantine: {'/'.join(key)} is held by {len(names)} quarantine claims: {', '.join(sorted(names))}"
        for key, names in sorted(parked.items()) if len(set(names)) > 1]


def stale_reservations(claims: Iterable[Object], pods: Iterable[Object]) -> dict[tuple[str, ...], str]:
    """reservedFor pod entries whose pod does not exist or has another UID, keyed for tracking over time."""
    live = {(_meta(p).get("namespace"), _meta(p).get("name")): _meta(p).get("uid") for p in pods}
    stale: dict[tuple[str, ...], str] = {}
    for claim in claims:
        meta = _meta(claim)
        for entry in (claim.get("status") or {}).get("reservedFor") or []:
            if entry.get("resource") != "pods" or entry.get("apiGroup"):
                continue
            uid = live.get((meta.get("namespace"), entry.get("name")))
            if uid != entry.get("uid"):
                gone = "does not exist" if uid is None else f"is now another pod (uid {uid})"
                key = (str(meta.get("uid")), str(entry.get("name")), str(entry.get("uid")))
                stale[key] = (f"stale reservation: claim {meta.get('namespace')}/{meta.get('name')} is reserved for "
                              f"pod {entry.get('name')} (uid {entry.get('uid')}), which {gone}")
    return stale


@dataclass
class Objects:
    """What the leftover, shared-device and reservation rules read, as raw JSON dicts."""

    claims: list[Object] = field(default_factory=list)
    records: list[Object] = field(default_factory=list)
    slices: list[Object] = field(default_factory=list)
    taint_rules: list[Object] = field(default_factory=list)
    pods: list[Object] = field(default_factory=list)

    def claimwarden_uids(self) -> set[str]:
        """UIDs of the objects the leftover rule is about: quarantine claims, records, taint rules."""
        return {str(_meta(o).get("uid")) for o in self.owned()}

    def owned(self) -> list[Object]:
        return ([c for c in self.claims if is_quarantine_claim(c)] + self.records
                + [r for r in self.taint_rules if str(_meta(r).get("name", "")).startswith(RULE_PREFIX)])


def _describe(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    kind = obj.get("kind") or "object"
    namespace = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{kind} {namespace}{meta.get('name')}"


def _annotated(record: Mapping[str, Any], slices: Sequence[Mapping[str, Any]]) -> bool | None:
    """Whether a slice of the record's pool carries its mark; None when the pool has no slice now."""
    spec = record.get("spec") or {}
    pool = [s for s in slices if (s.get("spec") or {}).get("driver") == spec.get("driver")
            and ((s.get("spec") or {}).get("pool") or {}).get("name") == spec.get("pool")]
    if not pool:
        return None
    return any(ANNOTATION_PREFIX + str(spec.get("device")) in (_meta(s).get("annotations") or {}) for s in pool)


def leftovers(objects: Objects, *, existed_before: set[str] | None = None) -> list[str]:
    """claimwarden's objects that nothing justifies any more (see the module docstring).

    ``existed_before`` holds the UIDs present when the test started; None skips that part.
    """
    problems = []
    record_labels = {_label_value(str(_meta(r).get("name"))) for r in objects.records}
    # A device's quarantine claim carries the device's label, whichever of its records asked for it.
    device_labels = {_device_label(r.get("spec") or {}) for r in objects.records}
    record_names = {str(_meta(r).get("name")) for r in objects.records}
    for claim in objects.claims:
        if is_quarantine_claim(claim) and _meta(claim)["labels"][RECORD_LABEL] not in record_labels | device_labels:
            problems.append(f"leftover: quarantine claim {_describe(claim)} names record "
                            f"{_meta(claim)['labels'][RECORD_LABEL]!r}, which is gone")
    for record in objects.records:
        if (record.get("spec") or {}).get("source") == DRIVER_ANNOTATION_SOURCE and \
                _annotated(record, objects.slices) is False:
            spec = record["spec"]
            problems.append(f"leftover: record {_meta(record).get('name')} (from an annotation) outlived its mark "
                            f"{ANNOTATION_PREFIX}{spec.get('device')} on pool {spec.get('pool')}")
    record_uids = {str(_meta(r).get("uid")) for r in objects.records}
    for record in objects.records:
        if (record.get("spec") or {}).get("source") == SIBLING_SOURCE:
            owners = [str(o.get("uid")) for o in _meta(record).get("ownerReferences") or []]
            if not set(owners) & record_uids:
                problems.append(f"leftover: record {_meta(record).get('name')} (derived for a sibling) outlived "
                                "the record it was derived from")
    for rule in objects.taint_rules:
        name = str(_meta(rule).get("name", ""))
        if name.startswith(RULE_PREFIX) and name.removeprefix(RULE_PREFIX) not in record_names:
            label = (_meta(rule).get("labels") or {}).get(RECORD_LABEL)
            if label not in record_labels:
                problems.append(f"leftover: DeviceTaintRule {name} has no record")
    if existed_before is not None:
        for obj in objects.owned():
            if str(_meta(obj).get("uid")) not in existed_before:
                problems.append(f"leftover: {_describe(obj)} appeared during the test and is still there"
                                + _mark_note(obj, objects.slices))
    return problems


def _mark_note(obj: Mapping[str, Any], slices: Sequence[Mapping[str, Any]]) -> str:
    if obj.get("kind") == "UnhealthyDevice" and _annotated(obj, slices):
        return " (the test left its mark on the slice: unmark at the end)"
    return ""


def _label_value(record_name: str) -> str:
    from claimwarden.health.records import label_value

    return label_value(record_name)


def _device_label(spec: Mapping[str, Any]) -> str:
    from claimwarden.health.plan import device_label
    from claimwarden.health.records import DeviceRef

    return device_label(DeviceRef(str(spec.get("driver") or ""), str(spec.get("pool") or ""),
                                  str(spec.get("device") or "")))


# --- the shell: reading a lab --------------------------------------------------------------------

def _get(api: client.ApiClient, path: str) -> Object:
    """GET ``path`` as raw JSON (the shape the pure rules read), raising ApiException on errors."""
    request = api.param_serialize("GET", path, header_params={"Accept": "application/json"},
                                  auth_settings=["BearerToken"])
    response = api.call_api(*request)
    body = response.read()
    if not 200 <= response.status <= 299:
        raise ApiException(status=response.status, reason=str(body[:200]))
    data: Object = json.loads(body)
    return data


def _items(api: client.ApiClient, path: str, kind: str) -> list[Object]:
    try:
        items = _get(api, path).get("items") or []
    except ApiException as exc:
        if exc.status == 404:  # a resource this lab does not serve (DeviceTaintRule)
            return []
        raise
    for item in items:
        item.setdefault("kind", kind)
    return list(items)


def _taint_rules(api: client.ApiClient) -> list[Object]:
    from .helpers import taint_rule_version

    version = taint_rule_version(api)
    return _items(api, f"/apis/resource.k8s.io/{version}/devicetaintrules", "DeviceTaintRule") if version else []


def read_objects(api: client.ApiClient) -> Objects:
    return Objects(
        claims=_items(api, "/apis/resource.k8s.io/v1/resourceclaims", "ResourceClaim"),
        records=_items(api, "/apis/claimwarden.io/v1alpha1/unhealthydevices", "UnhealthyDevice"),
        slices=_items(api, "/apis/resource.k8s.io/v1/resourceslices", "ResourceSlice"),
        taint_rules=_taint_rules(api),
        pods=_items(api, "/api/v1/pods", "Pod"))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_from(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines written to ``path`` since ``offset`` and the offset after them (rotation restarts at 0)."""
    try:
        with path.open("rb") as f:
            if f.seek(0, 2) < offset:
                offset = 0
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end


def audit_events(lines: Iterable[str]) -> list[Object]:
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


class LabAudit:
    """The audit-log rules for one lab, from the moment this object is made."""

    def __init__(self, state: LabState, *, from_start: bool = False) -> None:
        self.state = state
        self.offset = 0 if from_start else _size(state.audit_log)

    def new_events(self) -> list[Object]:
        lines, self.offset = read_from(self.state.audit_log, self.offset)
        return audit_events(lines)

    def check_events(self, rules: Rules = Rules()) -> list[str]:
        events = self.new_events()
        return hot_objects(events, bound=rules.max_writes) + repeated_evictions(events)


class LogWatch:
    """The part of each registered claimwarden log written after this object is made."""

    def __init__(self, registry: Callable[[], Iterable[Path]]) -> None:
        self.registry = registry
        self.offsets = {path: _size(path) for path in registry()}

    def check(self, rules: Rules = Rules()) -> list[str]:
        problems = []
        for path in self.registry():
            lines, self.offsets[path] = read_from(path, self.offsets.get(path, 0))
            problems += log_problems(lines, expected=rules.expect_log, source=str(path))
        return problems


class Audit:
    """Every rule for one test on one lab: made when the test starts, checked when it ends."""

    def __init__(self, state: LabState, api: client.ApiClient, logs: LogWatch) -> None:
        self.api = api
        self.lab = LabAudit(state)
        self.logs = logs
        self.before = read_objects(api).claimwarden_uids()

    def check(self, rules: Rules = Rules(), *, namespace: str | None = None,
              converge: float = CONVERGE_SECONDS) -> list[str]:
        return self.lab.check_events(rules) + self.logs.check(rules) + self.check_objects(
            rules, namespace=namespace, converge=converge)

    def _namespace_gone(self, namespace: str | None) -> bool:
        if not namespace:
            return True
        try:
            client.CoreV1Api(self.api).read_namespace(namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    def check_objects(self, rules: Rules = Rules(), *, namespace: str | None = None,
                      converge: float = CONVERGE_SECONDS) -> list[str]:
        """Poll until the object rules hold; fail only once ``namespace`` is gone or ``converge`` s passed.

        Clean at the first look is the usual case and costs one round of lists: the namespace's
        deletion (seconds) is waited for only when something is wrong. A stale reservation counts
        once it lasted more than 10 s.
        """
        deadline = time.monotonic() + converge
        first_seen: dict[tuple[str, ...], float] = {}
        while True:
            now = time.monotonic()
            objects = read_objects(self.api)
            problems = shared_devices(objects.claims)
            if rules.leftovers:
                problems += leftovers(objects, existed_before=self.before)
            stale = stale_reservations(objects.claims, objects.pods)
            first_seen = {key: first_seen.get(key, now) for key in stale}
            lasting = [stale[k] + f" (for {now - t:.0f}s)" for k, t in first_seen.items()
                       if now - t > STALE_RESERVATION_SECONDS]
            if not problems and not stale:
                return []
            gone = self._namespace_gone(namespace)
            if now >= deadline:
                left = [] if gone else [
                    f"namespace {namespace} still exists {converge:.0f}s after its deletion; its claims: "
                    + ", ".join(f"{_meta(c).get('name')} (finalizers {_meta(c).get('finalizers')})"
                                for c in objects.claims if _meta(c).get("namespace") == namespace)]
                return problems + lasting + left
            if gone and not problems and len(lasting) == len(stale):
                return lasting
            time.sleep(0.5)
