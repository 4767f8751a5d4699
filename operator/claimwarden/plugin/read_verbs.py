"""The read verbs' handlers: `explain`, `doctor`, `devices`. Each reads one snapshot, calls the pure
module of its verb and prints the answer in the -o format asked for (output.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .errors import EXIT_BAD, EXIT_OK, InputError
from .output import emit, explanation_data, explanation_text, format_table, print_names

_KINDS = {"pod": "pod", "pods": "pod", "po": "pod", "resourceclaim": "claim", "resourceclaims": "claim",
          "resourceclaim.resource.k8s.io": "claim"}


def explain(cluster: Any, args: argparse.Namespace) -> int:
    from .explain import explain_claim, explain_pod

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
        emit(explanation_data(explanation), args.output)
    elif args.output == "name":  # the claims explained, as doctor names them
        print_names(f"resourceclaim/{claim.ref}" for claim in explanation.claims if claim.ref)
    else:
        print(explanation_text(explanation, wide=args.output == "wide"))
    return EXIT_OK if explanation.verdict.allocatable else EXIT_BAD


def doctor(cluster: Any, args: argparse.Namespace) -> int:
    from .doctor import ERROR, Thresholds, check
    from .explain import explain_pod
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
        emit({"findings": [f.as_dict() for f in findings], "errors": errors,
               "warnings": len(findings) - errors}, args.output)
    elif args.output == "name":
        print_names(dict.fromkeys(o for f in findings for o in f.objects))
    elif not findings:
        print("no problems found")
    else:
        for finding in findings:
            print(f"{finding.severity.upper():7} {finding.check}: {', '.join(finding.objects)}")
            print(f"        {finding.message}")
            print(f"        fix: {finding.fix}")
        print(f"{errors} error(s), {len(findings) - errors} warning(s)")
    return EXIT_BAD if errors else EXIT_OK


def devices(cluster: Any, args: argparse.Namespace) -> int:
    from .devices import SelectorError, rows, select

    snapshot = cluster.snapshot(pods=False, claimwarden_namespace=args.claimwarden_namespace)
    try:
        selected = select(rows(snapshot), snapshot, node=args.node, state=args.state, selector=args.selector)
    except SelectorError as exc:
        raise InputError(str(exc)) from None
    if args.output in ("json", "yaml"):
        emit({"devices": [r.as_dict() for r in selected]}, args.output)
        return EXIT_OK
    if args.output == "name":  # the DEVICE form mark, clear and approve take
        print_names(f"{r.driver}/{r.pool}/{r.device}" for r in selected)
        return EXIT_OK
    if not selected:
        print("no devices" + (" match" if args.node or args.state or args.selector else " are published"),
              file=sys.stderr)
        return EXIT_OK
    wide = args.output == "wide"
    headers = ["NODE", "POOL", "DEVICE", "MODEL", "STATE", "HOLDER"] + (
        ["DRIVER", "CLAIM", "SIBLINGS", "REASON"] if wide else [])
    cells = [[r.node, r.pool, r.device, r.model, r.state, r.holder or "-"]
             + ([r.driver, r.claim or "-", r.siblings or "-", r.reason or "-"] if wide else []) for r in selected]
    print(format_table(headers, cells))
    return EXIT_OK
