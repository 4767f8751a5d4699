"""`claimwarden run | lab ...`"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from . import __version__


def _controllers(text: str) -> tuple[str, ...]:
    from .app import ALL_CONTROLLERS

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    wrong = [n for n in names if n not in ALL_CONTROLLERS]
    if wrong or not names:
        raise argparse.ArgumentTypeError(
            f"unknown controller(s) {','.join(wrong) or '(none given)'}; choose from {','.join(ALL_CONTROLLERS)}")
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 1.0 <= value <= 86400.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 1 to 86400")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction above 0 and at most 1 (1 turns the breaker off)")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of pods (0 or more)")
    return int(text)


def _qps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate of evictions per second (0 means no budget)")
    return value


def _parser() -> argparse.ArgumentParser:
    from .lab.cluster import default_dir

    parser = argparse.ArgumentParser(prog="claimwarden", description=__doc__)
    parser.add_argument("--version", action="version", version=f"claimwarden {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator against the current kubeconfig (or in-cluster)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    run.add_argument("--controllers", type=_controllers, default="claims,reservations,health,metrics",
                     help="comma-separated controllers to run (default: all)")
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                     help="liveness endpoint URL to serve (default: %(default)s)")
    run.add_argument("--metrics-address", default="0.0.0.0", help="metrics listen address")
    run.add_argument("--metrics-port", type=int, default=9090, help="metrics port (default: %(default)s)")
    run.add_argument("--namespace", default="claimwarden-system",
                     help="namespace for claimwarden's own objects, e.g. quarantine claims (default: %(default)s)")
    run.add_argument("--resync-period", type=_seconds, default=300.0,
                     help="seconds between full resyncs, which also forget objects deleted while a watch was "
                          "down (default: %(default)s)")
    run.add_argument("--request-timeout", type=float, default=30.0,
                     help="seconds one API request (write or point read) may take in all (default: %(default)s)")
    run.add_argument("--breaker-max-fraction", type=_fraction, default=0.3,
                     help="eviction breaker: open when NoExecute marks would evict, with the evictions of the "
                          "window, more than this fraction of the pods holding a driver's devices; 1 turns it "
                          "off (default: %(default)s)")
    run.add_argument("--breaker-max-pods", type=_count, default=None,
                     help="eviction breaker: also open above this many pods per driver (default: off)")
    run.add_argument("--breaker-min-pods", type=_count, default=8,
                     help="eviction breaker: the fraction never allows fewer than this many pods, so one broken "
                          "node is always emptied at once (default: %(default)s)")
    run.add_argument("--breaker-window", type=_seconds, default=600.0,
                     help="eviction breaker: seconds evictions are remembered (default: %(default)s)")
    run.add_argument("--eviction-qps", type=_qps, default=10.0,
                     help="eviction budget: Eviction API calls per second, 0 means no budget (default: %(default)s)")
    run.add_argument("--eviction-burst", type=_count, default=20,
                     help="eviction budget: calls that may go out at once (default: %(default)s)")
    run.add_argument("--verbose", action="store_true", help="debug logging")
    run.add_argument("--log-format", choices=["plain", "full", "json"], default="plain")

    lab = sub.add_parser("lab", help="a local Kubernetes control plane with fake DRA GPUs")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    dir_help = f"lab state directory (default: {default_dir()})"
    lab_up = lab_sub.add_parser("up", help="start the lab in the background and wait until it is ready")
    lab_up.add_argument("--dir", type=Path, default=default_dir(), help=dir_help)
    lab_up.add_argument("--nodes", type=int, default=2, help="kwok nodes (default: %(default)s)")
    lab_up.add_argument("--gpus-per-node", type=int, default=8, help="devices per node (default: %(default)s)")
    lab_up.add_argument("--models", help="GPU models given to nodes round-robin, from H100,A100,L4")
    lab_up.add_argument("--upstream-claims", action="store_true",
                        help="also run kube-controller-manager's resourceclaim-controller")
    lab_up.add_argument("--feature-gates", default="", help="feature gates for apiserver, scheduler and KCM")
    lab_up.add_argument("--runtime-config", default="", help="kube-apiserver --runtime-config")
    lab_up.add_argument("--api-port", type=int, default=0, help="apiserver port (default: any free port)")
    restart = lab_sub.add_parser("restart-apiserver",
                                 help="restart kube-apiserver with the same arguments and wait until it is ready")
    restart.add_argument("--dir", type=Path, default=default_dir(), help=dir_help)
    restart.add_argument("--compact", action="store_true",
                         help="first compact etcd to its current revision, so old resourceVersions are gone (410)")
    for name, text in (("down", "stop the lab and remove its state"), ("status", "show the lab's processes"),
                       ("env", "print shell lines that point KUBECONFIG and PATH at the lab")):
        cmd = lab_sub.add_parser(name, help=text)
        cmd.add_argument("--dir", type=Path, default=default_dir(), help=dir_help)
    return parser


def _run(args: argparse.Namespace) -> int:
    import kopf

    from . import app
    from .health import breaker
    from .health.controller import HealthSettings

    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        print(f"claimwarden: kubeconfig {args.kubeconfig} does not exist", file=sys.stderr)
        return 2
    app.CONFIG.controllers = args.controllers
    app.CONFIG.kubeconfig = args.kubeconfig
    app.CONFIG.metrics_address = args.metrics_address
    app.CONFIG.metrics_port = args.metrics_port
    app.CONFIG.namespace = args.namespace
    app.CONFIG.resync_seconds = args.resync_period
    app.CONFIG.request_timeout = args.request_timeout
    app.CONFIG.health = HealthSettings(
        breaker=breaker.Settings(max_fraction=args.breaker_max_fraction, max_pods=args.breaker_max_pods,
                                 min_pods=args.breaker_min_pods, window=timedelta(seconds=args.breaker_window)),
        eviction_qps=args.eviction_qps, eviction_burst=max(args.eviction_burst, 1))
    kopf.configure(verbose=args.verbose, log_format={
        "plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}[args.log_format])
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        app.CONFIG.server_version = app.server_version()
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(f"claimwarden: cannot reach the Kubernetes API ({reason}); "
              "check --kubeconfig, $KUBECONFIG or the in-cluster service account", file=sys.stderr)
        return 1
    if "health" in args.controllers:
        if not app.records_crd_installed():
            print("claimwarden: the UnhealthyDevice CRD (unhealthydevices.claimwarden.io) is not installed; "
                  "run 'kubectl apply -k crds/', or leave 'health' out of --controllers", file=sys.stderr)
            return 1
        app.register_health_handlers()
    kopf_state = app.KopfState()
    kopf.run(standalone=True, clusterwide=True, liveness_endpoint=args.liveness, indexers=kopf_state.indexers,
             memories=kopf_state.memories, memo=kopf.Memo(kopf_state=kopf_state))
    return 0


def _lab(args: argparse.Namespace) -> int:
    from .lab import cluster
    from .lab.processes import LabError

    def say(line: str) -> None:
        print(f"lab: {line}", flush=True)

    try:
        if args.lab_command == "up":
            cluster.up(cluster.LabOptions(
                dir=args.dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node, models=args.models,
                upstream_claims=args.upstream_claims, feature_gates=args.feature_gates,
                runtime_config=args.runtime_config, api_port=args.api_port), say)
        elif args.lab_command == "down":
            cluster.down(args.dir, say)
        elif args.lab_command == "restart-apiserver":
            state = cluster.LabState.load(args.dir.expanduser().resolve())
            if state is None:
                raise LabError(f"no lab in {args.dir}: run 'claimwarden lab up' first")
            if args.compact:
                say(f"etcd compacted to revision {cluster.compact_etcd(state)}")
            cluster.restart_apiserver(state, say)
        elif args.lab_command == "status":
            print("\n".join(cluster.status(args.dir)))
        elif args.lab_command == "env":
            print("\n".join(cluster.env_lines(args.dir)))
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lab: interrupted; everything started so far was stopped", file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    return _lab(args)
