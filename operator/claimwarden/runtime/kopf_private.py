"""The one door to Kopf's private API, and the self-test that guards it.

Kopf's public API (``kopf.*``) covers handlers, settings and ``kopf.run``. claimwarden reaches past it
for five things, and only here:

- its stores of watched objects (``OperatorIndexers``, ``ResourceMemories``), created by us and handed
  to ``kopf.run`` so that `staleness.py` can forget objects deleted while a watch was down;
- the operator's ``Identity``, named by us (Kopf's default asks ``getpass``, which fails in a pod whose
  uid has no passwd entry);
- ``aiotoggles.ToggleSet``, replaced by `kopf_toggles.CountingToggleSet` (Kopf's is cubic in the objects);
- the registry's changing and spawning handlers, which `kopf_diffbase.py` checks are none;
- the probe activity, which the liveness endpoint of `server.py` runs as Kopf's own server did.

Private names change in any release without notice. So Kopf is pinned exactly (``kopf==KOPF_PIN`` in
pyproject.toml), and `claimwarden run` calls `check` before anything else: it compares the installed
version with the pin and looks up every private name, attribute and parameter listed in `NEEDS`. A
Kopf upgraded for a CVE then stops the operator with one clear line, never with a silent change of
behaviour or an ImportError deep in a start-up.

This module imports even where the private names are gone (the imports below are guarded), so that
`check` can say what is missing; nothing else may use them before `check` has passed.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

KOPF_PIN = "1.45.2"

try:
    from kopf._cogs.aiokits import aiotoggles
    from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet
    from kopf._core.actions import lifecycles
    from kopf._core.engines import activities
    from kopf._core.engines.indexing import OperatorIndexers
    from kopf._core.engines.peering import Identity
    from kopf._core.intents import causes
    from kopf._core.reactor.inventory import ResourceMemories
except ImportError:  # `check` names what is missing; nothing uses these names before it passes
    pass

__all__ = ["KOPF_PIN", "Identity", "OperatorIndexers", "ResourceMemories", "Toggle", "ToggleSet", "check",
           "diffbase_handlers", "install_toggle_set", "run_probes"]


@dataclass(frozen=True)
class Need:
    """One private thing claimwarden relies on: ``module.name`` with these attributes and parameters."""

    module: str
    name: str = ""  # "" is the module itself
    attributes: tuple[str, ...] = ()
    parameters: tuple[str, ...] = ()  # keyword parameters of the callable (of __init__ for a class)
    instance_attributes: tuple[str, ...] = ()  # set on an instance made with `probe_args`
    probe_args: tuple[Any, ...] = ()

    def label(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


NEEDS: tuple[Need, ...] = (
    Need("kopf", "run", parameters=("indexers", "memories", "identity", "liveness_endpoint", "memo",
                                    "standalone", "clusterwide")),
    Need("kopf._core.engines.indexing", "OperatorIndexers", attributes=("discard",),
         instance_attributes=("indices",)),
    Need("kopf._core.reactor.inventory", "ResourceMemories", attributes=("forget",)),
    Need("kopf._core.engines.peering", "Identity"),
    # kopf_toggles: a subclass of each; Kopf must look the set up through the module when it makes one,
    # so that replacing the module's attribute takes effect.
    Need("kopf._cogs.aiokits.aiotoggles", "Toggle", attributes=("turn_to", "is_on"), parameters=("name",)),
    Need("kopf._cogs.aiokits.aiotoggles", "ToggleSet",
         attributes=("make_toggle", "drop_toggle", "drop_toggles", "wait_for", "is_on", "is_off"),
         parameters=("fn",), instance_attributes=("_fn",), probe_args=(all,)),
    Need("kopf._core.reactor.orchestration", "aiotoggles"),
    Need("kopf._core.reactor.running", "aiotoggles"),
    # kopf_diffbase: the handlers that read the diff-base.
    Need("kopf", "OperatorRegistry", instance_attributes=("_changing", "_spawning")),
    # server.py's /healthz: Kopf's probe activity.
    Need("kopf._core.engines.activities", "run_activity",
         parameters=("lifecycle", "registry", "settings", "activity", "indices", "memo")),
    Need("kopf._core.actions.lifecycles", "all_at_once"),
    Need("kopf._core.intents.causes", "Activity", attributes=("PROBE",)),
)


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def missing(needs: Iterable[Need], *, find_module: Callable[[str], Any] = _import) -> list[str]:
    """What of ``needs`` cannot be found, one phrase each; ``find_module`` returns a module or None."""
    found: list[str] = []
    for need in needs:
        module = find_module(need.module)
        target = module if not need.name else getattr(module, need.name, None)
        if target is None:
            found.append(need.label())
            continue
        found.extend(f"{need.label()}.{attr}" for attr in need.attributes if not hasattr(target, attr))
        if need.parameters:
            try:
                parameters = inspect.signature(target).parameters
            except (TypeError, ValueError):
                parameters = {}  # type: ignore[assignment]
            found.extend(f"{need.label()}({name}=)" for name in need.parameters if name not in parameters)
        if need.instance_attributes:
            try:
                instance = target(*need.probe_args)
            except Exception as exc:
                found.append(f"{need.label()}() ({type(exc).__name__}: {exc})")
                continue
            found.extend(f"{need.label()}()->{attr}" for attr in need.instance_attributes
                         if not hasattr(instance, attr))
    # The swap of ToggleSet works only where Kopf makes its sets from the module's attribute.
    toggles = find_module("kopf._cogs.aiokits.aiotoggles")
    for name in ("kopf._core.reactor.orchestration", "kopf._core.reactor.running"):
        module = find_module(name)
        if module is not None and toggles is not None and (
                getattr(module, "aiotoggles", None) is not toggles or hasattr(module, "ToggleSet")):
            found.append(f"{name} making ToggleSets through kopf._cogs.aiokits.aiotoggles")
    return found


def problem(*, claimwarden_version: str, installed: str | None, absent: list[str], pin: str = KOPF_PIN
            ) -> str | None:
    """The one-line refusal to start, or None when the installed Kopf is the pinned one and whole."""
    if installed == pin and not absent:
        return None
    why = []
    if installed != pin:
        why.append(f"a version other than {pin}")
    if absent:
        why.append("missing " + ", ".join(absent))
    return (f"claimwarden {claimwarden_version} needs kopf=={pin} (it uses Kopf's private API, which changes "
            f"without notice between releases); installed {installed or 'none'}: {'; '.join(why)}. "
            f"Install kopf=={pin}, or a claimwarden release made for the Kopf you need")


def check(claimwarden_version: str) -> str | None:
    """The start-up self-test on the installed Kopf: None, or the message to exit with."""
    try:
        installed: str | None = metadata.version("kopf")
    except metadata.PackageNotFoundError:
        installed = None
    return problem(claimwarden_version=claimwarden_version, installed=installed, absent=missing(NEEDS))


def install_toggle_set(toggle_set: type[ToggleSet]) -> None:
    """Make Kopf create ``toggle_set`` wherever it makes a ToggleSet (it looks the class up in the module)."""
    aiotoggles.ToggleSet = toggle_set  # type: ignore[misc]


def diffbase_handlers(registry: Any) -> list[tuple[str, Any]]:
    """(kind, handler) of every changing and spawning handler of a Kopf ``OperatorRegistry``."""
    return [(kind, handler)
            for kind, handlers in (("changing", registry._changing.get_all_handlers()),
                                   ("spawning", registry._spawning.get_all_handlers()))
            for handler in handlers]


async def run_probes(*, registry: Any, settings: Any, indexers: OperatorIndexers, memo: Any) -> dict[str, Any]:
    """Run every ``@kopf.on.probe`` handler as Kopf's liveness server does; {handler id: result}."""
    results = await activities.run_activity(lifecycle=lifecycles.all_at_once, registry=registry,
                                            settings=settings, activity=causes.Activity.PROBE,
                                            indices=indexers.indices, memo=memo)
    return {str(handler_id): result for handler_id, result in results.items()}
