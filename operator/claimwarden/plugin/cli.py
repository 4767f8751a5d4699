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
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from .errors import EXIT_CLUSTER, EXIT_INPUT, EXIT_OK, InputError

VERBS = ("explain", "doctor", "devices", "mark", "clear", "approve", "drain", "uninstall", "version", "completion")


class _VerbParser(argparse.ArgumentParser):
    """A verb's parser. `only_with` names flags the verb reads only beside another one (drain reads -o only with
    --dry-run, its plan; a drain itself prints its progress as it goes): without it they are unrecognized
    arguments, as any flag the verb does not read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.only_with: dict[str, str] = {}

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = super().parse_known_args(args, namespace)
        for dest, needed in self.only_with.items():
            value = getattr(parsed, dest, None)
            if value is not None and not getattr(parsed, needed, False):
                extras.append(f"--{dest}={value} (only with --{needed.replace('_', '-')})")
                setattr(parsed, dest, None)
        return parsed, extras


def _common(parser: argparse.ArgumentParser, *, output: tuple[str, ...] = ("wide", "json", "yaml"),
            namespaces: tuple[str, ...] = (), output_note: str = "") -> None:
    """The connection flags, plus only the namespace flags (`-n`, `-A`) the verb's handler reads."""
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    if "-n" in namespaces:
        parser.add_argument("-n", "--namespace", help="namespace (default: the context's, else 'default')")
    if "-A" in namespaces:
        parser.add_argument("-A", "--all-namespaces", action="store_true", help="all namespaces")
    if output:
        parser.add_argument("-o", "--output", choices=output, help="output format: " + "|".join(output) + output_note)
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
    sub = top.add_subparsers(dest="verb", required=True, metavar="{" + ",".join(VERBS) + "}",
                             parser_class=_VerbParser)
    explain = sub.add_parser("explain", help="why a pod's (or a claim's) devices can or cannot be allocated")
    explain.add_argument("target", help="pod/NAME or resourceclaim/NAME (a bare NAME is a pod)")
    _common(explain, output=("wide", "json", "yaml", "name"), namespaces=("-n",))
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
    mark.add_argument("--expires",
                      help="when the mark lapses: a Go duration from now (30m, 12h, 168h) or an RFC 3339 date-time")
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
    _common(drain, output=("json", "yaml", "name"), output_note=" (only with --dry-run: its plan)")
    drain.only_with["output"] = "dry_run"
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
    _common(uninstall, output=("json", "yaml", "name"))
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
    from . import meta, read_verbs, write_verbs
    from .output import emit
    from .read import Cluster, ClusterError

    if args.verb == "completion":
        print(meta.bash_completion(top) if args.shell == "bash" else meta.zsh_completion(top), end="")
        return EXIT_OK
    if args.verb == "version":
        if args.client and (args.kubeconfig or args.context):
            return _fail(prog, "--client reads nothing from a cluster: drop --kubeconfig and --context", EXIT_INPUT)
        return meta.run_version(args, emit)

    try:
        cluster = Cluster(kubeconfig=args.kubeconfig, context=args.context)
    except ClusterError as exc:
        return _fail(prog, str(exc), EXIT_CLUSTER)
    try:
        handler = {"explain": read_verbs.explain, "doctor": read_verbs.doctor, "devices": read_verbs.devices,
                   "mark": write_verbs.mark, "clear": write_verbs.clear, "approve": write_verbs.approve,
                   "drain": write_verbs.drain, "uninstall": write_verbs.uninstall}
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
