"""`kubectl claimwarden version` and `kubectl claimwarden completion bash|zsh`: verbs about the plugin itself.

The completion scripts are written from the argparse parser (its subcommands, their flags and choices), so
they follow the parser without a second list to keep in step.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from claimwarden import __version__
from claimwarden.health import records

CRD_PLURALS = (records.PLURAL, "healthpolicies")


@dataclass(frozen=True)
class VerbSpec:
    """What completion needs from one subcommand: its flags and, per flag, the values it accepts."""

    name: str
    flags: tuple[str, ...]
    choices: dict[str, tuple[str, ...]]


def verb_specs(top: argparse.ArgumentParser) -> list[VerbSpec]:
    """Every subcommand of the parser with its option strings (and choices) in the parser's order."""
    found: list[VerbSpec] = []
    for action in top._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            flags: list[str] = []
            choices: dict[str, tuple[str, ...]] = {}
            for option in sub._actions:
                flags += [s for s in option.option_strings if s not in ("-h",)]
                if option.option_strings and option.choices:
                    for flag in option.option_strings:
                        choices[flag] = tuple(str(c) for c in option.choices)
            found.append(VerbSpec(name=name, flags=tuple(flags), choices=choices))
    return found


def bash_completion(top: argparse.ArgumentParser, *, command: str = "kubectl-claimwarden") -> str:
    """A bash script defining _kubectl_claimwarden and registering it for `command`."""
    specs = verb_specs(top)
    verbs = " ".join(s.name for s in specs)
    cases = []
    for spec in specs:
        values = "".join(f"            {flag}) COMPREPLY=($(compgen -W \"{' '.join(vals)}\" -- \"$cur\")); return;;\n"
                         for flag, vals in spec.choices.items())
        cases.append(f"        {spec.name})\n          case \"$prev\" in\n{values}"
                     f"          esac\n          COMPREPLY=($(compgen -W \"{' '.join(spec.flags)}\" -- \"$cur\"));;\n")
    return ("# bash completion for kubectl claimwarden (generated from its parser)\n"
            "_kubectl_claimwarden() {\n"
            "    local cur prev verb i\n"
            "    cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
            "    prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
            "    verb=\"\"\n"
            "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
            f"        case \" {verbs} \" in *\" ${{COMP_WORDS[i]}} \"*) verb=\"${{COMP_WORDS[i]}}\"; break;; esac\n"
            "    done\n"
            "    case \"$verb\" in\n"
            f"        \"\") COMPREPLY=($(compgen -W \"{verbs}\" -- \"$cur\"));;\n"
            + "".join(cases) +
            "    esac\n"
            "}\n"
            f"complete -o default -F _kubectl_claimwarden {command}\n")


def zsh_completion(top: argparse.ArgumentParser, *, command: str = "kubectl-claimwarden") -> str:
    """The bash script under zsh's bashcompinit, which runs bash completion functions unchanged."""
    return ("#compdef " + command + "\n"
            "autoload -U +X bashcompinit && bashcompinit\n"
            + bash_completion(top, command=command))


def version_data(server: dict[str, Any] | None, crds: dict[str, bool] | None) -> dict[str, Any]:
    """The plugin's version, and the cluster's when one was reached."""
    data: dict[str, Any] = {"clientVersion": {"claimwarden": __version__}}
    if server is not None:
        data["serverVersion"] = {"gitVersion": server.get("gitVersion"), "platform": server.get("platform")}
    if crds is not None:
        data["crds"] = crds
    return data


def version_text(data: dict[str, Any], unreachable: str | None) -> str:
    lines = [f"Client Version: claimwarden {data['clientVersion']['claimwarden']}"]
    if "serverVersion" in data:
        lines.append(f"Server Version: {data['serverVersion']['gitVersion']}")
    if "crds" in data:
        lines.append("CRDs: " + ", ".join(f"{plural}.{records.GROUP} "
                                          + ("installed" if ok else "missing ('kubectl apply -k crds/')")
                                          for plural, ok in data["crds"].items()))
    if unreachable:
        lines.append(f"Server: not reached ({unreachable})")
    return "\n".join(lines)


def read_cluster(cluster: Any) -> tuple[dict[str, Any], dict[str, bool]]:
    """Two GETs: /version, and the discovery document of claimwarden's API group."""
    from .read import NotFound

    server = dict(cluster.request("GET", "/version"))
    try:
        group = cluster.request("GET", f"/apis/{records.GROUP}/{records.VERSION}")
        served = {r.get("name") for r in group.get("resources") or []}
    except NotFound:
        served = set()
    return server, {plural: plural in served for plural in CRD_PLURALS}


def run_version(args: argparse.Namespace, emit: Any) -> int:
    """Print the versions; the client's always, exit 0, even with no cluster to reach."""
    from .read import Cluster, ClusterError

    server: dict[str, Any] | None = None
    crds: dict[str, bool] | None = None
    unreachable = None
    if not args.client:
        try:
            cluster = Cluster(kubeconfig=args.kubeconfig, context=args.context)
            try:
                server, crds = read_cluster(cluster)
            finally:
                cluster.close()
        except ClusterError as exc:
            unreachable = str(exc)
    data = version_data(server, crds)
    if args.output:
        emit(data, args.output)
    else:
        print(version_text(data, unreachable))
    return 0
