"""The write verbs' handlers: `mark` (and its --dry-run preview), `clear`, `approve`, `drain` and
`uninstall` (whose --check only reads). Each reads, plans in a pure module, writes what the plan says
and prints the result in the -o format asked for (output.py)."""

from __future__ import annotations

import argparse
from typing import Any

from .errors import EXIT_BAD, EXIT_OK, InputError
from .output import emit, print_names


def mark(cluster: Any, args: argparse.Namespace) -> int:
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
        emit(body, args.output)
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
        emit({"device": str(ref), "wouldEvict": list(found.evict), "tolerating": found.tolerating}, output)
        return EXIT_OK
    shown = ", ".join(found.evict[:50]) + (f" (and {len(found.evict) - 50} more)" if len(found.evict) > 50 else "")
    print(f"{ref}: dry run, nothing written; a NoExecute mark would evict {len(found.evict)} pod(s)"
          + (f": {shown}" if found.evict else "")
          + (f"; {found.tolerating} pod(s) tolerate it" if found.tolerating else ""))
    return EXIT_OK


def approve(cluster: Any, args: argparse.Namespace) -> int:
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
        emit(body, args.output)
    else:
        generation = (body.get("metadata") or {}).get("generation")
        print(f"{ref}: evictions approved by {username} for generation {generation} (record unhealthydevice/{name}); "
              "claimwarden records it in status.approval, and a later change of the record's spec needs a new approval"
              + (f"; also the {len(siblings)} record(s) derived for its siblings: "
                 + ", ".join(n for n, _ in siblings) if siblings else ""))
    return EXIT_OK


def clear(cluster: Any, args: argparse.Namespace) -> int:
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
        emit({"device": str(ref), "cleared": True}, args.output)
    else:
        print(message)
    return EXIT_OK


def drain(cluster: Any, args: argparse.Namespace) -> int:
    from . import drain, drainer

    if args.dry_run and (args.timeout or args.force_after):
        raise InputError("--timeout and --force-after do nothing with --dry-run (it waits for nothing): drop them")
    settings = drainer.Settings(node=args.node, timeout=args.timeout, force_after=args.force_after,
                                options=drain.Options(force=args.force, delete_emptydir_data=args.delete_emptydir_data),
                                claimwarden_namespace=args.claimwarden_namespace)
    try:
        if args.dry_run and args.output:
            return _drain_plan(drainer.read_plan(cluster, settings, drainer.Memory()), args.output)
        if args.dry_run:
            return drainer.dry_run(cluster, settings, say=lambda line: print(line, flush=True))
        return drainer.run(cluster, settings, say=lambda line: print(line, flush=True))
    except drainer.NodeNotFound:
        raise InputError(f"node {args.node!r} not found; 'kubectl get nodes' lists them") from None


def _drain_plan(plan: Any, output: str) -> int:
    """drain --dry-run -o: the plan as a document, or (-o name) every object it would act on, in step order."""
    from . import drainer

    if output == "name":
        print_names([f"node/{plan.node}", *(f"pod/{p.ref}" for p in plan.consumers),
                     *(f"resourceclaim/{h.ref}" for h in plan.claims), *(f"pod/{p.ref}" for p in plan.rest)])
    else:
        emit(drainer.plan_data(plan), output)
    return drainer.EXIT_NOT_DRAINED if plan.refused else drainer.EXIT_DRAINED


def uninstall(cluster: Any, args: argparse.Namespace) -> int:
    from .uninstall import plan, report

    found = plan(cluster.snapshot(pods=False, claimwarden_namespace=args.claimwarden_namespace))
    if args.hand_over:
        return _hand_over(cluster, found, args.output)
    if args.output == "name":  # the devices an uninstall would free, in the DEVICE form mark takes
        print_names("/".join(release.device) for release in found.freed)
    elif args.output:
        emit(found.as_dict(), args.output)
    else:
        print("\n".join(report(found)))
    return EXIT_BAD if found.freed else EXIT_OK


def _hand_over(cluster: Any, found: Any, output: str | None) -> int:
    from .handover import HandOverError, hand_over

    try:
        written, kept = hand_over(cluster, found)
    except HandOverError as exc:
        raise InputError(str(exc)) from None
    if output == "name":
        print_names(f"devicetaintrule/{name}" for name in written)
        return EXIT_OK
    if output:
        emit({"written": written, "alreadyKeptOff": ["/".join(r.device) for r in kept]}, output)
        return EXIT_OK
    print("\n".join([f"handed over to devicetaintrule {name} (NoSchedule, owned by nothing)" for name in written]
                    + [f"{'/'.join(r.device)}: already kept off by devicetaintrule {', '.join(r.lasting_rules)}"
                       for r in kept]))
    print(f"{len(written)} rule(s) written; {len(written) + len(kept)} of {len(found.releases)} marked device(s) "
          "stay kept off after the uninstall; delete each rule once its device is repaired")
    return EXIT_OK
