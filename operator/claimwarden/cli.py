"""`claimwarden run | lab ... | explain | doctor | devices | mark | clear`"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from . import __version__, durations

if TYPE_CHECKING:
    from .settings import RunSettings

PLUGIN_VERBS = ("explain", "doctor", "devices", "mark", "clear", "approve")
ALL_CONTROLLERS = ("claims", "reservations", "health", "metrics")
_DURATION = "a Go duration (like 30s, 5m, 1h30m) or, as before, a plain number of seconds"


def _controllers(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    wrong = [n for n in names if n not in ALL_CONTROLLERS]
    if wrong or not names:
        raise argparse.ArgumentTypeError(
            f"unknown controller(s) {','.join(wrong) or '(none given)'}; choose from {','.join(ALL_CONTROLLERS)}")
    return names


def _within(text: str, low: float, high: float, bounds: str) -> float:
    """Seconds from a Go duration (5m, 1h30m, 2.5s) or, as these flags took before, a plain number of seconds."""
    try:
        value = durations.parse_seconds(text)
    except durations.DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration from {bounds}")
    return value


def _seconds(text: str) -> float:
    return _within(text, 1.0, 86400.0, "1s to 24h")


def _cache_period(text: str) -> float:
    return _within(text, 0.0, 300.0, "0s to 5m")


def _timeout(text: str) -> float:
    return _within(text, 0.0, math.inf, "0s up")


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


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


def _rate(what: str, zero: str) -> Callable[[str], float]:
    """An argparse type for a non-negative rate of `what` per second."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a rate of {what} per second (0 means {zero})")
        return value
    return parse


_qps = _rate("evictions", "no budget")
_api_qps = _rate("API requests", "no limit")


def _alert_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate of alerts per second above 0")
    return value


def _burst(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of requests (1 or more)")
    return int(text)


def _workers(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers from 1 to 256")
    return int(text)


def _lab_cli() -> ModuleType | None:
    """The lab's command line, when the claimwarden-lab distribution is installed (never in the image)."""
    try:
        return importlib.import_module("claimwarden_lab.cli")
    except ModuleNotFoundError:
        return None


def _parser(lab_cli: ModuleType | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="claimwarden", description=__doc__)
    parser.add_argument("--version", action="version", version=f"claimwarden {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator against the current kubeconfig (or in-cluster)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    run.add_argument("--controllers", type=_controllers, default="claims,reservations,health,metrics",
                     help="comma-separated controllers to run (default: all)")
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                     help="liveness endpoint URL to serve (default: %(default)s)")
    run.add_argument("--readiness", default="",
                     help="readiness endpoint URL to serve, e.g. http://0.0.0.0:8082/readyz: 200 once every watched "
                          "resource is listed and while the Lease was read within a lease duration (default: none)")
    run.add_argument("--metrics-address", default="0.0.0.0", help="metrics listen address")
    run.add_argument("--metrics-port", type=int, default=9090, help="metrics port (default: %(default)s)")
    run.add_argument("--namespace", default=None,
                     help="namespace for claimwarden's own objects: its Lease and the quarantine claims (default: "
                          "the pod's own, from $POD_NAMESPACE or the ServiceAccount's namespace file; outside a "
                          f"pod {DEFAULT_NAMESPACE})")
    run.add_argument("--resync-period", type=_seconds, default="5m", metavar="DURATION",
                     help="time between full resyncs, which also forget objects deleted while a watch was down; "
                          f"{_DURATION} (default: %(default)s)")
    run.add_argument("--metrics-cache-period", type=_cache_period, default="5s", metavar="DURATION",
                     help="how long a computed gauge (claims, devices, records) is served again before it is "
                          f"computed anew from every object; 0 computes it on every scrape; {_DURATION} "
                          "(default: %(default)s)")
    run.add_argument("--request-timeout", type=_timeout, default="30s", metavar="DURATION",
                     help=f"how long one API request (write or point read) may take in all; {_DURATION} "
                          "(default: %(default)s)")
    run.add_argument("--kube-api-qps", type=_api_qps, default=0.0, metavar="QPS",
                     help="client-side limit on claimwarden's own API requests (writes, point reads, the lease; "
                          "not its watches), as kube-controller-manager's flag of that name; 0 means no limit "
                          "(default: %(default)s)")
    run.add_argument("--kube-api-burst", type=_burst, default=None, metavar="N",
                     help="requests that may go out at once under --kube-api-qps (default: twice the QPS)")
    run.add_argument("--workers", type=_workers, default=50,
                     help="concurrent workers per controller queue, as kube-controller-manager's resourceclaim "
                          "controller runs (default: %(default)s)")
    run.add_argument("--leader-elect", type=_boolean, default=True, metavar="true|false",
                     help="elect a leader through a Lease in --namespace, so that several replicas can run; "
                          "false runs the controllers at once, alone (default: true)")
    run.add_argument("--leader-elect-lease-duration", type=_seconds, default="15s", metavar="DURATION",
                     help=f"how long standbys wait after the leader's last renewal; {_DURATION} (default: %(default)s)")
    run.add_argument("--leader-elect-renew-deadline", type=_seconds, default="10s", metavar="DURATION",
                     help="how long the leader keeps trying to renew before it gives up; it sends writes only within "
                          "this time after its last renewal, the rest of the lease is left for writes on their "
                          f"way; {_DURATION} (default: %(default)s)")
    run.add_argument("--leader-elect-retry-period", type=_seconds, default="2s", metavar="DURATION",
                     help=f"time between tries to acquire or renew; {_DURATION} (default: %(default)s)")
    run.add_argument("--breaker-max-fraction", type=_fraction, default=0.3,
                     help="eviction breaker: open when NoExecute marks would evict, with the evictions of the "
                          "window, more than this fraction of the pods holding a driver's devices; 1 turns it "
                          "off (default: %(default)s)")
    run.add_argument("--breaker-max-pods", type=_count, default=None,
                     help="eviction breaker: also open above this many pods per driver (default: off)")
    run.add_argument("--breaker-min-pods", type=_count, default=8,
                     help="eviction breaker: the fraction never allows fewer than this many pods, so one broken "
                          "node is always emptied at once (default: %(default)s)")
    run.add_argument("--breaker-window", type=_seconds, default="10m", metavar="DURATION",
                     help=f"eviction breaker: how long evictions are remembered; {_DURATION} (default: %(default)s)")
    run.add_argument("--eviction-qps", type=_qps, default=10.0,
                     help="eviction budget: Eviction API calls per second, 0 means no budget (default: %(default)s)")
    run.add_argument("--eviction-burst", type=_count, default=20,
                     help="eviction budget: calls that may go out at once (default: %(default)s)")
    run.add_argument("--eviction-retry-qps", type=_qps, default=1.0,
                     help="eviction budget: calls per second for retries of evictions a PodDisruptionBudget "
                          "refused, apart from --eviction-qps; 0 means no budget (default: %(default)s)")
    run.add_argument("--eviction-workers", type=_count, default=32,
                     help="evictions (and marked devices' records) handled at once; the breaker and the budget "
                          "still bound what they start (default: %(default)s)")
    run.add_argument("--alert-webhook-address", default="0.0.0.0",
                     help="Alertmanager webhook: listen address (default: %(default)s)")
    run.add_argument("--alert-webhook-port", type=int, default=8443,
                     help="Alertmanager webhook: port; 0 turns it off. It is off anyway unless --alert-token-file "
                          "or --alert-client-ca-file is given (default: %(default)s)")
    run.add_argument("--alert-token-file", metavar="FILE",
                     help="Alertmanager webhook: bearer tokens, one a line, that callers must present (Alertmanager's "
                          "http_config.authorization.credentials_file); read again when the file changes")
    run.add_argument("--alert-tls-cert-file", metavar="FILE",
                     help="Alertmanager webhook: serve HTTPS with this certificate (reloaded when it changes)")
    run.add_argument("--alert-tls-key-file", metavar="FILE", help="Alertmanager webhook: the certificate's key")
    run.add_argument("--alert-client-ca-file", metavar="FILE",
                     help="Alertmanager webhook: require client certificates signed by this CA (mTLS; needs "
                          "--alert-tls-cert-file)")
    run.add_argument("--alert-rate", type=_alert_rate, default=50.0,
                     help="Alertmanager webhook: new firing alerts per second accepted; more are answered 429 "
                          "(default: %(default)s)")
    run.add_argument("--alert-burst", type=_burst, default=200,
                     help="Alertmanager webhook: new firing alerts accepted at once (default: %(default)s)")
    run.add_argument("--nvsentinel-handoff", type=_boolean, default=False, metavar="true|false",
                     help="hand node-scoped device faults to NVIDIA NVSentinel as ExternalFaults, where its CRD is "
                          "served (needs manifests/nvsentinel's RBAC; default: %(default)s)")
    run.add_argument("--nvsentinel-poll-period", type=_seconds, default="10s", metavar="DURATION",
                     help=f"how often an open ExternalFault is read for FaultCleared; {_DURATION} "
                          "(default: %(default)s)")
    run.add_argument("--verbose", action="store_true", help="debug logging")
    run.add_argument("--log-format", choices=["plain", "full", "json"], default="plain")

    for verb, text in (("explain", "why a pod's claims can or cannot be allocated (the kubectl plugin's verb)"),
                       ("doctor", "find what is wrong with claims and devices"),
                       ("devices", "one line per device: node, pool, device, model, state, holder"),
                       ("mark", "mark a device unhealthy"), ("clear", "clear a device's mark"),
                       ("approve", "let a marked device's evictions past the eviction breaker")):
        sub.add_parser(verb, help=text, add_help=False)
    lab = sub.add_parser("lab", help="a local Kubernetes control plane with fake DRA GPUs (the claimwarden-lab "
                                     "distribution, for development: pip install ./lab from a clone)")
    if lab_cli is not None:
        lab_cli.add_arguments(lab)
    else:
        lab.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


DEFAULT_NAMESPACE = "claimwarden-system"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace(environ: Mapping[str, str] = os.environ, namespace_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The namespace claimwarden runs in, as controller-runtime finds it: $POD_NAMESPACE (the Downward API), else
    the mounted ServiceAccount's namespace file, else DEFAULT_NAMESPACE (a run outside a pod). A Deployment moved
    to another namespace by an overlay thus keeps its Lease and quarantine claims where its Role grants them."""
    if environ.get("POD_NAMESPACE", "").strip():
        return environ["POD_NAMESPACE"].strip()
    try:
        return namespace_file.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


class SettingsError(Exception):
    """Flags that parse one by one but not together (the leader election's durations)."""


def run_settings(args: argparse.Namespace) -> RunSettings:
    """`claimwarden run`'s parsed flags as the frozen settings its handlers read; pure (no API calls).

    What the server serves is not known yet: `_run` adds it with `dataclasses.replace`.
    """
    from .handoff.controller import HandoffSettings
    from .health import breaker
    from .health.controller import HealthSettings
    from .leader.elector import ElectionSettings, default_identity
    from .settings import RunSettings
    from .signals.webhook import WebhookSettings

    namespace = args.namespace or own_namespace()
    election = None
    if args.leader_elect:
        election = ElectionSettings(
            namespace=namespace, identity=default_identity(),
            lease_seconds=max(1, round(args.leader_elect_lease_duration)),
            renew_deadline_seconds=args.leader_elect_renew_deadline,
            retry_seconds=args.leader_elect_retry_period)
        if election.problems():
            raise SettingsError("; ".join(election.problems()))
    webhook = WebhookSettings(
        address=args.alert_webhook_address, port=args.alert_webhook_port, token_file=args.alert_token_file,
        tls_cert_file=args.alert_tls_cert_file, tls_key_file=args.alert_tls_key_file,
        client_ca_file=args.alert_client_ca_file, rate=args.alert_rate, burst=args.alert_burst)
    if webhook.problems():
        raise SettingsError("; ".join(webhook.problems()))
    from .runtime import server

    try:
        server.check_urls({"--liveness": args.liveness, "--readiness": args.readiness, "--metrics-port":
                           server.metrics_url(args.metrics_address, args.metrics_port)
                           if "metrics" in args.controllers else ""})
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    health = HealthSettings(
        breaker=breaker.Settings(max_fraction=args.breaker_max_fraction, max_pods=args.breaker_max_pods,
                                 min_pods=args.breaker_min_pods, window=timedelta(seconds=args.breaker_window)),
        eviction_qps=args.eviction_qps, eviction_burst=max(args.eviction_burst, 1),
        eviction_retry_qps=args.eviction_retry_qps,
        workers=max(args.eviction_workers, 1))
    return RunSettings(
        controllers=args.controllers, kubeconfig=args.kubeconfig, namespace=namespace,
        metrics_address=args.metrics_address, metrics_port=args.metrics_port,
        resync_seconds=args.resync_period, metrics_cache_seconds=args.metrics_cache_period,
        request_timeout=args.request_timeout, api_qps=args.kube_api_qps,
        api_burst=args.kube_api_burst or max(1, round(2 * args.kube_api_qps)),
        workers=args.workers, election=election, health=health, webhook=webhook if webhook.enabled else None,
        readiness=args.readiness, liveness=args.liveness,
        handoff=HandoffSettings(nvsentinel=args.nvsentinel_handoff, poll_seconds=args.nvsentinel_poll_period))


def _run(args: argparse.Namespace) -> int:
    import kopf

    from . import app, discovery
    from .runtime import operator as runtime

    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        print(f"claimwarden: kubeconfig {args.kubeconfig} does not exist", file=sys.stderr)
        return 2
    try:
        settings = run_settings(args)
    except SettingsError as exc:
        print(f"claimwarden: {exc}", file=sys.stderr)
        return 2
    kopf.configure(verbose=args.verbose, log_format={
        "plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}[args.log_format])
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        server_version = discovery.server_version(kubeconfig=settings.kubeconfig)
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(f"claimwarden: cannot reach the Kubernetes API ({reason}); "
              "check --kubeconfig, $KUBECONFIG or the in-cluster service account", file=sys.stderr)
        return 1
    settings = dataclasses.replace(settings, server_version=server_version,
                                   podgroup_version=discovery.served_podgroup_version(kubeconfig=settings.kubeconfig))
    if settings.podgroup_version is not None:
        app.register_podgroup_handlers(settings.podgroup_version)
    if "health" in settings.controllers:
        if not discovery.records_crd_installed(kubeconfig=settings.kubeconfig):
            print("claimwarden: the UnhealthyDevice CRD (unhealthydevices.claimwarden.io) is not installed; "
                  "run 'kubectl apply -k crds/', or leave 'health' out of --controllers", file=sys.stderr)
            return 1
        signals = discovery.records_crd_installed(kubeconfig=settings.kubeconfig, plural="healthpolicies")
        if not signals:
            print("claimwarden: the HealthPolicy CRD (healthpolicies.claimwarden.io) is not installed; device health "
                  "from signals is off ('kubectl apply -k crds/' installs it)", file=sys.stderr)
        app.register_health_handlers(signals=signals)
    kopf_state = runtime.KopfState()
    # Kopf's peering is off, but Kopf still names the process, by default from getpass.getuser(),
    # which raises KeyError in a pod whose uid has no /etc/passwd entry (65532 in our image, as
    # Kubernetes runs it; podman adds an entry, so only a real node showed it). Name it ourselves.
    from .leader.elector import default_identity
    from .runtime.kopf_private import Identity

    identity = Identity(settings.election.identity if settings.election else default_identity())
    from .runtime import kopf_toggles

    kopf_toggles.install()
    try:  # /healthz is runtime/server.py's, beside /metrics and /readyz: Kopf serves no liveness of its own
        kopf.run(standalone=True, clusterwide=True, liveness_endpoint=None, indexers=kopf_state.indexers,
                 memories=kopf_state.memories, memo=kopf.Memo(kopf_state=kopf_state, run_settings=settings),
                 identity=identity)
    except Exception as exc:  # Kopf logged the failure with its traceback already; this is the process's end
        logging.getLogger("claimwarden").error("Kopf stopped on an error (%s); exiting",
                                               " ".join(f"{type(exc).__name__}: {exc}".split())[:300])
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in PLUGIN_VERBS:
        # The kubectl plugin's verbs; imported only for them, so `claimwarden run` never loads the plugin.
        from .plugin.cli import main as plugin_main

        return plugin_main(argv, prog="claimwarden")
    # The lab is imported only for its own verbs: `claimwarden run` never loads it.
    lab_cli = _lab_cli() if argv[:1] == ["lab"] else None
    args = _parser(lab_cli).parse_args(argv)  # imports nothing of Kopf: `run --help` answers without it
    if args.command == "run":
        # Before any module that uses Kopf's private names is imported.
        from .runtime import kopf_private

        refusal = kopf_private.check(__version__)
        if refusal is not None:
            print(f"claimwarden: {refusal}", file=sys.stderr)
            return 1
        return _run(args)
    if lab_cli is None:
        print("claimwarden: the lab is not installed: it is a development tool, installed from a clone with "
              "'pip install ./lab' (make venv does it)", file=sys.stderr)
        return 2
    return int(lab_cli.run(args))
