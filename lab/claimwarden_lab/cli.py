"""`claimwarden lab ...`: the lab's verbs, added to claimwarden's command line when this distribution is installed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kubernetes import config

from . import cluster, demo, disruptions, driver, presets, slice_taints
from .binaries import K8S_VERSION, VERSIONS
from .cluster import default_dir
from .processes import LabError


def add_arguments(lab: argparse.ArgumentParser) -> None:
    """The `lab` sub-commands and their options."""
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    dir_help = f"lab state directory (default: {default_dir()})"
    lab_up = lab_sub.add_parser("up", help="start the lab in the background and wait until it is ready")
    lab_up.add_argument("--dir", type=Path, default=default_dir(), help=dir_help)
    lab_up.add_argument("--nodes", type=int, default=2, help="kwok nodes (default: %(default)s)")
    lab_up.add_argument("--gpus-per-node", type=int, default=8, help="devices per node (default: %(default)s)")
    lab_up.add_argument("--models", help="GPU models given to nodes round-robin, from H100,A100,L4")
    lab_up.add_argument("--profile", default=driver.PROFILE_PLAIN, choices=driver.PROFILES,
                        help="the fake driver's devices: plain GPUs, or partitionable (each GPU whole and as two "
                             "halves sharing its counter set; Kubernetes 1.35+) (default: %(default)s)")
    lab_up.add_argument("--upstream-claims", action="store_true",
                        help="also run kube-controller-manager's resourceclaim-controller")
    lab_up.add_argument("--feature-gates", default="", help="feature gates for apiserver, scheduler and KCM")
    lab_up.add_argument("--runtime-config", default="", help="kube-apiserver --runtime-config")
    lab_up.add_argument("--kubernetes", default=K8S_VERSION,
                        help=f"control-plane version, one of {', '.join(VERSIONS)} (default: %(default)s; "
                             "each is built once by 'make bins K8S_VERSION=...')")
    lab_up.add_argument("--preset", default="", dest="presets",
                        help="turn DRA features on with this version's gates and runtime-config: comma-separated "
                             f"from {', '.join(presets.names())} (see docs/development/binaries.md)")
    lab_up.add_argument("--kcm-qps", type=float, default=0,
                        help="kube-controller-manager's --kube-api-qps (burst twice that; default: its own, 20)")
    lab_up.add_argument("--api-port", type=int, default=0, help="apiserver port (default: any free port)")
    lab_up.add_argument("--real-node", action="store_true",
                        help="also one real node (kubelet, containerd, runc, CNI bridge; needs root): see "
                             "docs/development/real-node.md")
    restart = lab_sub.add_parser("restart-apiserver",
                                 help="restart kube-apiserver with the same arguments and wait until it is ready")
    restart.add_argument("--dir", type=Path, default=default_dir(), help=dir_help)
    restart.add_argument("--compact", action="store_true",
                         help="first compact etcd to its current revision, so old resourceVersions are gone (410)")
    taint = lab_sub.add_parser("taint", help="publish a taint on a device of the fake driver's slice, as NVIDIA's "
                                             "driver does on a broken GPU (one taint per key: the latest value wins)")
    taint.add_argument("node", help="the node whose slice lists the device, e.g. kwok-node-0")
    taint.add_argument("device", help="the device, e.g. gpu-3")
    taint.add_argument("--key", required=True, help="taint key, e.g. gpu.nvidia.com/xid or gpu.nvidia.com/gpu-lost")
    taint.add_argument("--value", default="", help="taint value, e.g. an XID code: 79 (default: none)")
    taint.add_argument("--effect", default="NoSchedule", choices=driver.TAINT_EFFECTS,
                       help="taint effect (default: %(default)s; NVIDIA's driver uses NoSchedule and None, which "
                            "the apiserver accepts from 1.35)")
    taint.add_argument("--remove", action="store_true", help="remove the taint with that key instead")
    taint.add_argument("--dir", type=Path, default=default_dir(), help=dir_help)
    demo = lab_sub.add_parser("demo", help="start the lab and claimwarden, play the DRA walkthrough and a broken "
                                           "GPU against it, then keep claimwarden running (Ctrl-C stops it)")
    demo.add_argument("--dir", type=Path, default=default_dir(), help=dir_help + "; a lab running there is reused")
    demo.add_argument("--pause", action="store_true", help="wait for Enter between scenes (live presentations)")
    demo.add_argument("--exit", action="store_true",
                      help="end after the last scene, stopping what the demo started (claimwarden; the lab if it "
                           "started it)")
    demo.add_argument("--models", help="GPU models for the demo's lab, e.g. H100,A100,L4: adds a scene where a "
                                       "prioritized list falls back from H100 to A100")
    for name, text in (("down", "stop the lab and remove its state"), ("status", "show the lab's processes"),
                       ("env", "print shell lines that point KUBECONFIG and PATH at the lab")):
        cmd = lab_sub.add_parser(name, help=text)
        cmd.add_argument("--dir", type=Path, default=default_dir(), help=dir_help)


def run(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        print(f"lab: {line}", flush=True)

    if args.lab_command == "demo":
        return demo.run(demo.DemoOptions(dir=args.dir, pause=args.pause, exit=args.exit, models=args.models))
    try:
        if args.lab_command == "up":
            cluster.up(cluster.LabOptions(
                dir=args.dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node, models=args.models,
                upstream_claims=args.upstream_claims, feature_gates=args.feature_gates,
                runtime_config=args.runtime_config, api_port=args.api_port,
                real_node=args.real_node, kubernetes=args.kubernetes, presets=args.presets,
                kcm_qps=args.kcm_qps, profile=args.profile), say)
        elif args.lab_command == "down":
            cluster.down(args.dir, say)
        elif args.lab_command == "restart-apiserver":
            state = cluster.LabState.load(args.dir.expanduser().resolve())
            if state is None:
                raise LabError(f"no lab in {args.dir}: run 'claimwarden lab up' first")
            if args.compact:
                say(f"etcd compacted to revision {disruptions.compact_etcd(state)}")
            disruptions.restart_apiserver(state, say)
        elif args.lab_command == "taint":
            state = cluster.LabState.load(args.dir.expanduser().resolve())
            if state is None:
                raise LabError(f"no lab in {args.dir}: run 'claimwarden lab up' first")
            with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
                taints = slice_taints.taint_device(api, args.node, args.device, args.key, args.value, args.effect,
                                              remove=args.remove)
            shown = ", ".join(f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect')} "
                              f"(added {t.get('timeAdded')})" for t in taints)
            say(f"{args.node}/{args.device} taints: {shown or 'none'}")
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
