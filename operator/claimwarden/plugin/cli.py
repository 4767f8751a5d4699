"""`kubectl claimwarden explain | doctor | devices | mark | clear | approve | drain | uninstall | version |
completion` (also `claimwarden <verb>`).

Follows kubectl's conventions: --kubeconfig, --context, -n/--namespace, -A/--all-namespaces,
-o wide|json|yaml|name; each verb takes only the flags its handler reads.
Exit codes: 0 fine (explain: allocatable or allocated; doctor: no errors); 1 the answer is bad (explain: blocked;
doctor: error findings); 2 bad input (usage, a missing object, a malformed selector); 3 the cluster cannot be
reached or refuses. drain: 0 drained (or, with --dry-run, the plan printed); 1 not drained (--timeout passed, or
pods need --force/--delete-emptydir-data).
uninstall --check: 0 an uninstall frees no marked device; 1 it would hand one or more back to the scheduler.
uninstall --hand-over: 0 every marked device is kept off by a DeviceTaintRule that outlives claimwarden; 2 the
cluster serves no DeviceTaintRule. version and completion exit 0, with or without a cluster.
Errors are one line on stderr that names the fix, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

EXIT_OK, EXIT_BAD, EXIT_INPUT, EXIT_CLUSTER = 0, 1, 2, 3
VERBS = ("explain", "doctor", "devices", "mark", "clear", "approve", "drain", "uninstall", "version", "completion")
DETAIL_WIDTH = 110


class InputError(Exception):
    """Bad input; the message names the fix (exit 2)."""


def _common(parser: argparse.ArgumentParser, *, output: tuple[str, ...] = ("wide", "json", "yaml"),
            namespaces: tuple[str, ...] = ()) -> None:
    """The connection flags, plus only the namespace flags (`-n`, `-A`) the verb's handler reads."""
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    if "-n" in namespaces:
        parser.add_argument("-n", "--namespace", help="namespace (default: the context's, else 'default')")
    if "-A" in namespaces:
        parser.add_argument("-A", "--all-namespaces", action="store_true", help="all namespaces")
    if output:
        parser.add_argument("-o", "--output", choices=output, help="output format: " + "|".join(output))
    parser.add_argument("--claimwarden-namespace", default="claimwarden-system",
                        help="claimwarden's own namespace, where its quarantine claims live (default: %(default)s)")


def _duration(text: str) -> timedelta:
    from claimwarden import durations

    try:
        return timedelta(seconds=durations.parse_seconds(text))  # a plain number is seconds, as before
    except durations.DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser(prog: str = "kubectl claimwarden") -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=prog, description="Explain pending DRA claims, check the cluster, show devices, mark broken ones.",
        epilog="exit codes: 0 fine; 1 blocked (explain), errors found (doctor) or marked devices freed "
               "(uninstall --check); 2 bad input; 3 cluster unreachable")
    sub = top.add_subparsers(dest="verb", required=True, metavar="{" + ",".join(VERBS) + "}")
    explain = sub.add_parser("explain", help="why a pod's (or a claim's) devices can or cannot be allocated")
    explain.add_argument("target", help="pod/NAME or resourceclaim/NAME (a bare NAME is a pod)")
    _common(explain, namespaces=("-n",))
    doctor = sub.add_parser("doctor", help="find what is wrong with claims and devices (all namespaces unless -n)")
    doctor.add_argument("--pending-after", type=_duration, default=timedelta(minutes=5),
                        help="report pods Pending on claims for longer than this (default: 5m)")
    doctor.add_argument("--stuck-after", type=_duration, default=timedelta(minutes=1),
                        help="report claims in deletion for longer than this (default: 1m)")
    _common(doctor, output=("json", "yaml", "name"), namespaces=("-n", "-A"))
    devices = sub.add_parser("devices", help="one line per device: node, pool, device, model, state, holder")
    devices.add_argument("--node", help="only devices of this node")
    devices.add_argument("--state", choices=("free", "allocated", "marked", "quarantined"))
    devices.add_argument("-l", "--selector", help="device attributes, e.g. model=H100,index!=0 (bare names are "
                                                  "in the driver's domain)")
    _common(devices, output=("wide", "json", "yaml", "name"))
    mark = sub.add_parser("mark", help="mark a device unhealthy (an UnhealthyDevice record, source manual)")
    mark.add_argument("device", metavar="DEVICE", help="[driver/]pool/device, e.g. kwok-node-0/gpu-3")
    mark.add_argument("--reason", required=True, help="why (shows in events and the record)")
    mark.add_argument("--effect", default="NoExecute", choices=("NoExecute", "NoSchedule", "None"),
                      help="NoExecute evicts, NoSchedule keeps new pods away, None is a dry run (default: NoExecute)")
    mark.add_argument("--expires", help="when the mark lapses: a duration (30m, 12h, 7d) or an RFC 3339 date-time")
    mark.add_argument("--scope", choices=("Device", "FaultDomain"),
                      help="FaultDomain: the device and its siblings (devices sharing its counter sets or parent); "
                           "Device: the device alone (default: FaultDomain for a whole device, Device for a partition)")
    mark.add_argument("--drain", metavar="MODE",
                      help="how a NoExecute mark empties the device: Immediate (the default), AllowCompletion, "
                           "EvictAfter=<duration> (EvictAfter=30m, 1h30m, 45s) or Node (its whole node)")
    mark.add_argument("--dry-run", action="store_true",
                      help="write nothing; show which pods a NoExecute mark would evict now")
    _common(mark, output=("json", "yaml"))
    clear = sub.add_parser("clear", help="clear a device's mark (deletes the record, or removes the slice annotation)")
    clear.add_argument("device", metavar="DEVICE", help="[driver/]pool/device")
    clear.add_argument("--verified", action="store_true",
                       help="for a mark made from health signals: you checked the device and it is healthy; "
                            "older signals never mark it again")
    _common(clear, output=("json", "yaml"))
    approve = sub.add_parser("approve", help="let a marked device's evictions past the eviction breaker, as you")
    approve.add_argument("device", metavar="DEVICE", help="[driver/]pool/device of the marked device")
    _common(approve, output=("json", "yaml"))
    drain = sub.add_parser("drain", help="cordon a node, evict its DRA consumers, wait for their claims to be "
                                         "released, then evict the rest (DaemonSet and mirror pods stay)")
    drain.add_argument("node", metavar="NODE")
    drain.add_argument("--timeout", type=_duration, help="give up after this long, exit 1 and name what is stuck "
                                                         "(default: wait for ever)")
    drain.add_argument("--force-after", type=_duration,
                       help="delete the pods a PodDisruptionBudget has refused for this long (past the budget) "
                            "and those Terminating this long past their grace period (with grace period 0)")
    drain.add_argument("--dry-run", action="store_true", help="print every step and object it would act on; "
                                                              "write nothing")
    drain.add_argument("--force", action="store_true", help="also evict pods that declare no controller")
    drain.add_argument("--delete-emptydir-data", action="store_true", help="also evict pods with emptyDir volumes")
    _common(drain, output=())
    uninstall = sub.add_parser("uninstall", help="before removing claimwarden: which marked devices the scheduler "
                                                 "would get back (read-only)")
    what = uninstall.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true",
                      help="read-only: list every marked device, what keeps new work off it, and which removal step "
                           "(claimwarden, its namespace, the CRDs) would free it; exit 1 if any")
    what.add_argument("--hand-over", action="store_true",
                      help="where DeviceTaintRule is served: write a NoSchedule DeviceTaintRule owned by nothing "
                           "(label claimwarden.io/handed-over=true) for each marked device, which outlives the "
                           "uninstall; writes nothing for a device already kept off so")
    _common(uninstall, output=("json", "yaml"))
    version = sub.add_parser("version", help="the plugin's version; with a reachable cluster also its version "
                                             "and whether claimwarden's CRDs are installed")
    version.add_argument("--client", action="store_true", help="the plugin's version only; read nothing")
    version.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    version.add_argument("--context", help="kubeconfig context (default: the current one)")
    version.add_argument("-o", "--output", choices=("json", "yaml"), help="output format: json|yaml")
    completion = sub.add_parser("completion", help="print a shell completion script: "
                                                   "'source <(kubectl claimwarden completion bash)'")
    completion.add_argument("shell", choices=("bash", "zsh"))
    return top


def main(argv: Sequence[str] | None = None, *, prog: str = "kubectl claimwarden") -> int:
    top = parser(prog)
    args = top.parse_args(list(sys.argv[1:] if argv is None else argv))
    from . import meta
    from .read import Cluster, ClusterError

    if args.verb == "completion":
        print(meta.bash_completion(top) if args.shell == "bash" else meta.zsh_completion(top), end="")
        return EXIT_OK
    if args.verb == "version":
        return meta.run_version(args, _emit)

    try:
        cluster = Cluster(kubeconfig=args.kubeconfig, context=args.context)
    except ClusterError as exc:
        return _fail(prog, str(exc), EXIT_CLUSTER)
    try:
        handler = {"explain": _explain, "doctor": _doctor, "devices": _devices, "mark": _mark, "clear": _clear,
                   "approve": _approve, "drain": _drain, "uninstall": _uninstall}
        return handler[args.verb](cluster, args)
    except InputError as exc:
        return _fail(prog, str(exc), EXIT_INPUT)
    except ClusterError as exc:
        return _fail(prog, str(exc), EXIT_CLUSTER)
    except KeyboardInterrupt:
        return 130
    finally:
        cluster.close()


def _fail(prog: str, message: str, code: int) -> int:
    print(f"{prog}: {message}", file=sys.stderr)
    return code


def _emit(data: Any, output: str | None) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, default=str))
    else:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())


def _names(names: Iterable[str]) -> None:
    """-o name: one per line, nothing at all for none."""
    for name in names:
        print(name)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines)


# --- explain ------------------------------------------------------------------------------------

_KINDS = {"pod": "pod", "pods": "pod", "po": "pod", "resourceclaim": "claim", "resourceclaims": "claim",
          "resourceclaim.resource.k8s.io": "claim"}


def _explain(cluster: Any, args: argparse.Namespace) -> int:
    from .funnel import explain_claim, explain_pod

    kind, _, name = args.target.rpartition("/")
    kind = kind.lower() or "pod"
    if kind not in _KINDS or not name:
        raise InputError(f"cannot explain {args.target!r}: give pod/NAME or resourceclaim/NAME")
    namespace = args.namespace or cluster.default_namespace
    snapshot = cluster.snapshot(pods_namespace=namespace, claimwarden_namespace=args.claimwarden_namespace)
    if _KINDS[kind] == "pod":
        pod = snapshot.pod_index.get((namespace, name))
        if pod is None:
            raise InputError(f"pod {name!r} not found in namespace {namespace!r}; check the name and -n")
        if not (pod.get("spec") or {}).get("resourceClaims"):
            raise InputError(f"pod {namespace}/{name} has no resourceClaims: DRA does not decide where it runs")
        explanation = explain_pod(snapshot, pod)
    else:
        claim = snapshot.claim_index.get((namespace, name))
        if claim is None:
            raise InputError(f"resourceclaim {name!r} not found in namespace {namespace!r}; check the name and -n "
                             "('kubectl get resourceclaims -n NAMESPACE' lists them)")
        explanation = explain_claim(snapshot, claim)
    if args.output in ("json", "yaml"):
        _emit(_explanation_data(explanation), args.output)
    else:
        print(_explanation_text(explanation, wide=args.output == "wide"))
    return EXIT_OK if explanation.verdict.allocatable else EXIT_BAD


def _explanation_data(explanation: Any) -> dict[str, Any]:
    verdict = explanation.verdict
    return {
        "target": explanation.target,
        "verdict": {"allocatable": verdict.allocatable, "allocated": verdict.allocated, "step": verdict.step,
                    "reason": verdict.reason, "nodes": verdict.nodes},
        "nodes": {"total": explanation.nodes_total, "fit": len(explanation.nodes_fit),
                  "excluded": explanation.nodes_excluded},
        "claims": [{
            "claim": c.ref, "podClaim": c.name, "source": c.source, "allocated": c.allocated,
            "devices": [f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}" for r in c.results],
            "reservedFor": c.reserved_for, "problem": c.problem, "siblings": c.siblings,
            "requests": [[{"request": f.req.label, "class": f.req.class_name, "wants": f.req.wants,
                           "blockedAt": f.blocked_at,
                           "funnel": [{"step": r.step, "left": r.left, "detail": r.detail} for r in f.rows]}
                          for f in alts] for alts in c.funnels],
        } for c in explanation.claims],
    }


def _explanation_text(explanation: Any, *, wide: bool) -> str:
    lines = [f"{explanation.target}"]
    excluded = "".join(f"; {why}: {n} excluded" for why, n in explanation.nodes_excluded.items())
    lines.append(f"nodes: {len(explanation.nodes_fit)} of {explanation.nodes_total} fit the pod{excluded}")
    for claim in explanation.claims:
        if not claim.ref:
            lines.append(f"claim {claim.name!r}: {claim.problem}")
            continue
        if claim.allocated:
            devices = ", ".join(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')} (request {r.get('request')})"
                                for r in claim.results)
            lines.append(f"claim {claim.ref} (from {claim.source}): allocated: {devices or 'no devices'}")
            lines.append(f"  reserved for: {', '.join(claim.reserved_for) or 'nobody'}")
            lines += [f"  siblings of {device} (its fault domain): {', '.join(names)}"
                      for device, names in claim.siblings.items()]
            continue
        lines.append(f"claim {claim.ref} (from {claim.source}): not allocated" + (
            f" ({claim.problem})" if claim.problem else ""))
        for alts in claim.funnels:
            for number, funnel in enumerate(alts):
                req = funnel.req
                head = f"  request {req.request}" + (
                    f", subrequest {req.sub} ({number + 1} of {len(alts)})" if req.sub else "")
                lines.append(f"{head}: class {req.class_name}, {req.wants}")
                rows = []
                for row in funnel.rows:
                    cut = not wide and len(row.detail) > DETAIL_WIDTH
                    detail = row.detail[:DETAIL_WIDTH - 1] + "…" if cut else row.detail
                    rows.append([row.title, str(row.left), detail])
                lines += ["    " + line for line in _table(["STEP", "LEFT", "DETAIL"], rows).splitlines()]
    lines.append(f"verdict: {explanation.verdict.reason}")
    return "\n".join(lines)


# --- doctor -------------------------------------------------------------------------------------

def _doctor(cluster: Any, args: argparse.Namespace) -> int:
    from .doctor import ERROR, Thresholds, check
    from .funnel import explain_pod
    from .snapshot import namespace_of

    namespace = None if args.all_namespaces else args.namespace
    snapshot = cluster.snapshot(claimwarden_namespace=args.claimwarden_namespace)
    if namespace:
        snapshot.claims = [c for c in snapshot.claims if namespace_of(c) in (namespace, args.claimwarden_namespace)]
        snapshot.pods = [p for p in snapshot.pods if namespace_of(p) == namespace]
    findings = check(snapshot, thresholds=Thresholds(pending=args.pending_after, deletion=args.stuck_after),
                     explain_reason=lambda pod: explain_pod(snapshot, pod).verdict.reason)
    if namespace:
        findings = [f for f in findings if any(f"/{namespace}/" in o for o in f.objects)
                    or not any(o.startswith(("pod/", "resourceclaim/")) for o in f.objects)]
    errors = sum(1 for f in findings if f.severity == ERROR)
    if args.output in ("json", "yaml"):
        _emit({"findings": [f.as_dict() for f in findings], "errors": errors,
               "warnings": len(findings) - errors}, args.output)
    elif args.output == "name":
        _names(dict.fromkeys(o for f in findings for o in f.objects))
    elif not findings:
        print("no problems found")
    else:
        for finding in findings:
            print(f"{finding.severity.upper():7} {finding.check}: {', '.join(finding.objects)}")
            print(f"        {finding.message}")
            print(f"        fix: {finding.fix}")
        print(f"{errors} error(s), {len(findings) - errors} warning(s)")
    return EXIT_BAD if errors else EXIT_OK


# --- devices ------------------------------------------------------------------------------------

def _devices(cluster: Any, args: argparse.Namespace) -> int:
    from .devices import SelectorError, rows, select

    snapshot = cluster.snapshot(pods=False, claimwarden_namespace=args.claimwarden_namespace)
    try:
        selected = select(rows(snapshot), snapshot, node=args.node, state=args.state, selector=args.selector)
    except SelectorError as exc:
        raise InputError(str(exc)) from None
    if args.output in ("json", "yaml"):
        _emit({"devices": [r.as_dict() for r in selected]}, args.output)
        return EXIT_OK
    if args.output == "name":  # the DEVICE form mark, clear and approve take
        _names(f"{r.driver}/{r.pool}/{r.device}" for r in selected)
        return EXIT_OK
    if not selected:
        print("no devices" + (" match" if args.node or args.state or args.selector else " are published"),
              file=sys.stderr)
        return EXIT_OK
    wide = args.output == "wide"
    headers = ["NODE", "POOL", "DEVICE", "MODEL", "STATE", "HOLDER"] + (
        ["DRIVER", "CLAIM", "SIBLINGS", "REASON"] if wide else [])
    table = [[r.node, r.pool, r.device, r.model, r.state, r.holder or "-"]
             + ([r.driver, r.claim or "-", r.siblings or "-", r.reason or "-"] if wide else []) for r in selected]
    print(_table(headers, table))
    return EXIT_OK


# --- mark / clear -------------------------------------------------------------------------------

def _mark(cluster: Any, args: argparse.Namespace) -> int:
    from claimwarden.health import records

    from .marking import MarkError, expiry, plan_mark, resolve
    from .read import RECORDS

    snapshot = cluster.snapshot(pods=args.dry_run, claimwarden_namespace=args.claimwarden_namespace)
    try:
        ref = resolve(snapshot, args.device)
        plan = plan_mark(snapshot, ref, reason=args.reason, effect=args.effect,
                         expires_at=expiry(args.expires, snapshot.now), scope=args.scope, drain=args.drain)
    except MarkError as exc:
        raise InputError(str(exc)) from None
    if args.dry_run:
        return _preview(snapshot, ref, args.output)
    if plan.create is not None:
        body = cluster.request("POST", RECORDS, plan.create)
        verb = "marked"
    else:
        body = cluster.request("PATCH", f"{RECORDS}/{plan.patch_name}", plan.patch,
                               content_type="application/merge-patch+json")
        verb = "mark updated"
    if args.output:
        _emit(body, args.output)
    else:
        spec = body.get("spec") or {}
        expires = f", expires {spec['expiresAt']}" if spec.get("expiresAt") else ""
        expires += f", drain {spec['drain']}" if spec.get("drain") else ""
        print(f"{ref}: {verb} {spec.get('effect')} ({spec.get('reason')}{expires}); "
              f"record {records.KIND.lower()}/{body['metadata']['name']}")
    return EXIT_OK


def _preview(snapshot: Any, ref: Any, output: str | None) -> int:
    from .marking import preview

    found = preview(snapshot, ref)
    if output:
        _emit({"device": str(ref), "wouldEvict": list(found.evict), "tolerating": found.tolerating}, output)
        return EXIT_OK
    shown = ", ".join(found.evict[:50]) + (f" (and {len(found.evict) - 50} more)" if len(found.evict) > 50 else "")
    print(f"{ref}: dry run, nothing written; a NoExecute mark would evict {len(found.evict)} pod(s)"
          + (f": {shown}" if found.evict else "")
          + (f"; {found.tolerating} pod(s) tolerate it" if found.tolerating else ""))
    return EXIT_OK


def _approve(cluster: Any, args: argparse.Namespace) -> int:
    from .marking import MarkError, approval, derived_records, resolve
    from .read import RECORDS

    snapshot = cluster.snapshot(pods=False, claimwarden_namespace=args.claimwarden_namespace)
    try:
        ref = resolve(snapshot, args.device)
        record = snapshot.records_by_device.get((ref.driver, ref.pool, ref.device))
        if record is None:
            raise MarkError(f"{ref} is not marked: there is no record to approve")
        name = record["metadata"]["name"]
        review = cluster.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                 {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        username = str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "")
        patch = approval(record, username)
        siblings = [(r["metadata"]["name"], approval(r, username)) for r in derived_records(snapshot, record)]
    except MarkError as exc:
        raise InputError(str(exc)) from None
    body = cluster.request("PATCH", f"{RECORDS}/{name}", patch, content_type="application/merge-patch+json")
    for sibling_name, sibling_patch in siblings:  # the siblings' pods are the ones a whole device's mark evicts
        cluster.request("PATCH", f"{RECORDS}/{sibling_name}", sibling_patch,
                        content_type="application/merge-patch+json")
    if args.output:
        _emit(body, args.output)
    else:
        generation = (body.get("metadata") or {}).get("generation")
        print(f"{ref}: evictions approved by {username} for generation {generation} (record unhealthydevice/{name}); "
              "claimwarden records it in status.approval, and a later change of the record's spec needs a new approval"
              + (f"; also the {len(siblings)} record(s) derived for its siblings: "
                 + ", ".join(n for n, _ in siblings) if siblings else ""))
    return EXIT_OK


def _clear(cluster: Any, args: argparse.Namespace) -> int:
    from .marking import MarkError, plan_clear, resolve
    from .read import RECORDS

    snapshot = cluster.snapshot(pods=False, claimwarden_namespace=args.claimwarden_namespace)
    try:
        ref = resolve(snapshot, args.device)
        plan = plan_clear(snapshot, ref, verified=args.verified)
    except MarkError as exc:
        raise InputError(str(exc)) from None
    if plan.verify_record is not None:
        from claimwarden.signals.records import VERIFIED_ANNOTATION
        from claimwarden.timestamps import now_rfc3339

        cluster.request("PATCH", f"{RECORDS}/{plan.verify_record}",
                        {"metadata": {"annotations": {VERIFIED_ANNOTATION: now_rfc3339()}}},
                        content_type="application/merge-patch+json")
        message = (f"{ref}: verified healthy (annotated unhealthydevice/{plan.verify_record}); claimwarden clears the "
                   "mark and never counts older signals again")
    elif plan.remove_annotation is not None:
        slice_name, key = plan.remove_annotation
        cluster.request("PATCH", f"/apis/resource.k8s.io/v1/resourceslices/{slice_name}",
                        {"metadata": {"annotations": {key: None}}}, content_type="application/merge-patch+json")
        message = f"{ref}: cleared (removed annotation {key} from resourceslice {slice_name})"
    else:
        cluster.request("DELETE", f"{RECORDS}/{plan.delete_record}")
        message = f"{ref}: cleared (deleted record unhealthydevice/{plan.delete_record})"
    if args.output:
        _emit({"device": str(ref), "cleared": True}, args.output)
    else:
        print(message)
    return EXIT_OK


# --- drain --------------------------------------------------------------------------------------

def _drain(cluster: Any, args: argparse.Namespace) -> int:
    from . import drain, drainer

    settings = drainer.Settings(node=args.node, timeout=args.timeout, force_after=args.force_after,
                                options=drain.Options(force=args.force, delete_emptydir_data=args.delete_emptydir_data),
                                claimwarden_namespace=args.claimwarden_namespace)
    try:
        if args.dry_run:
            return drainer.dry_run(cluster, settings, say=lambda line: print(line, flush=True))
        return drainer.run(cluster, settings, say=lambda line: print(line, flush=True))
    except drainer.NodeNotFound:
        raise InputError(f"node {args.node!r} not found; 'kubectl get nodes' lists them") from None


# --- uninstall ----------------------------------------------------------------------------------

def _uninstall(cluster: Any, args: argparse.Namespace) -> int:
    from .uninstall import plan, report

    found = plan(cluster.snapshot(pods=False, claimwarden_namespace=args.claimwarden_namespace))
    if args.hand_over:
        return _hand_over(cluster, found, args.output)
    if args.output:
        _emit(found.as_dict(), args.output)
    else:
        print("\n".join(report(found)))
    return EXIT_BAD if found.freed else EXIT_OK


def _hand_over(cluster: Any, found: Any, output: str | None) -> int:
    from .handover import HandOverError, hand_over

    try:
        written, kept = hand_over(cluster, found)
    except HandOverError as exc:
        raise InputError(str(exc)) from None
    if output:
        _emit({"written": written, "alreadyKeptOff": ["/".join(r.device) for r in kept]}, output)
        return EXIT_OK
    print("\n".join([f"handed over to devicetaintrule {name} (NoSchedule, owned by nothing)" for name in written]
                    + [f"{'/'.join(r.device)}: already kept off by devicetaintrule {', '.join(r.lasting_rules)}"
                       for r in kept]))
    print(f"{len(written)} rule(s) written; {len(written) + len(kept)} of {len(found.releases)} marked device(s) "
          "stay kept off after the uninstall; delete each rule once its device is repaired")
    return EXIT_OK
