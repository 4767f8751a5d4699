"""Kopf's private API behind one door: the exact pin, and the start-up self-test that guards it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import types
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from claimwarden import __version__
from claimwarden.runtime import kopf_private
from claimwarden.runtime.kopf_private import KOPF_PIN, NEEDS, Need, check, missing, problem

ROOT = Path(__file__).resolve().parents[2]


def test_kopf_is_pinned_exactly_to_the_installed_and_locked_version() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [dep for dep in dependencies if re.match(r"kopf\b", dep)] == [f"kopf=={KOPF_PIN}"]
    assert re.search(rf"^kopf=={re.escape(KOPF_PIN)} ", (ROOT / "requirements.lock").read_text(), re.M)
    assert metadata.version("kopf") == KOPF_PIN


def test_the_installed_kopf_passes_the_self_test() -> None:
    assert missing(NEEDS) == []
    assert check(__version__) is None


def test_no_product_module_but_the_door_names_kopfs_private_modules() -> None:
    product = ROOT / "operator" / "claimwarden"
    users = sorted(str(path.relative_to(product)) for path in product.rglob("*.py")
                   if re.search(r"\bkopf\._", path.read_text()))
    assert users == ["runtime/kopf_private.py"]


def _fake_kopf(**overrides: Any) -> dict[str, Any]:
    """The modules NEEDS names, as plain objects that have everything; ``overrides`` replace some."""

    class Toggle:
        def __init__(self, state: bool, *, name: str | None = None) -> None: ...
        async def turn_to(self, state: bool) -> None: ...
        def is_on(self) -> bool: return True

    class ToggleSet:
        def __init__(self, fn: Any) -> None:
            self._fn = fn
        make_toggle = drop_toggle = drop_toggles = wait_for = is_on = is_off = Toggle.is_on

    class Indexers:
        def __init__(self) -> None:
            self.indices = {}
        def discard(self) -> None: ...

    class Registry:
        def __init__(self) -> None:
            self._changing = self._spawning = None

    def run(*, indexers: Any, memories: Any, identity: Any, liveness_endpoint: Any, memo: Any, standalone: Any,
            clusterwide: Any) -> None: ...

    def run_activity(*, lifecycle: Any, registry: Any, settings: Any, activity: Any, indices: Any,
                     memo: Any) -> None: ...

    aiotoggles = types.SimpleNamespace(Toggle=Toggle, ToggleSet=ToggleSet)
    modules = {
        "kopf": types.SimpleNamespace(run=run, OperatorRegistry=Registry),
        "kopf._core.engines.indexing": types.SimpleNamespace(OperatorIndexers=Indexers),
        "kopf._core.reactor.inventory": types.SimpleNamespace(ResourceMemories=types.SimpleNamespace(forget=1)),
        "kopf._core.engines.peering": types.SimpleNamespace(Identity=str),
        "kopf._cogs.aiokits.aiotoggles": aiotoggles,
        "kopf._core.reactor.orchestration": types.SimpleNamespace(aiotoggles=aiotoggles),
        "kopf._core.reactor.running": types.SimpleNamespace(aiotoggles=aiotoggles),
        "kopf._core.engines.activities": types.SimpleNamespace(run_activity=run_activity),
        "kopf._core.actions.lifecycles": types.SimpleNamespace(all_at_once=object()),
        "kopf._core.intents.causes": types.SimpleNamespace(Activity=types.SimpleNamespace(PROBE="probe")),
    }
    modules.update(overrides)
    return modules


def test_a_whole_fake_kopf_misses_nothing() -> None:
    assert missing(NEEDS, find_module=_fake_kopf().get) == []


def test_a_missing_module_name_attribute_parameter_or_instance_attribute_is_named() -> None:
    modules = _fake_kopf()
    modules["kopf._core.engines.peering"] = None  # the module is gone
    del modules["kopf._core.intents.causes"].Activity.PROBE  # an attribute
    modules["kopf"].run = lambda *, indexers, memories, memo, standalone, clusterwide, liveness_endpoint: None
    modules["kopf._cogs.aiokits.aiotoggles"].ToggleSet.__init__ = lambda self, fn: None  # no _fn any more
    assert missing(NEEDS, find_module=modules.get) == [
        "kopf.run(identity=)", "kopf._core.engines.peering.Identity", "kopf._cogs.aiokits.aiotoggles.ToggleSet()->_fn",
        "kopf._core.intents.causes.Activity.PROBE"]


def test_kopf_binding_the_toggle_set_directly_defeats_the_swap_and_is_named() -> None:
    modules = _fake_kopf()
    modules["kopf._core.reactor.running"].ToggleSet = modules["kopf._cogs.aiokits.aiotoggles"].ToggleSet
    assert missing(NEEDS, find_module=modules.get) == [
        "kopf._core.reactor.running making ToggleSets through kopf._cogs.aiokits.aiotoggles"]


def test_a_constructor_that_fails_is_named_with_its_error() -> None:
    def broken() -> None:
        raise RuntimeError("needs a loop")

    assert missing([Need("m", "Thing", instance_attributes=("x",))],
                   find_module={"m": types.SimpleNamespace(Thing=broken)}.get) == [
        "m.Thing() (RuntimeError: needs a loop)"]


@pytest.mark.parametrize(("installed", "absent", "says"), [
    ("1.46.0", [], "installed 1.46.0: a version other than 1.45.2."),
    (None, [], "installed none: a version other than 1.45.2."),
    ("1.45.2", ["kopf.run(identity=)"], "installed 1.45.2: missing kopf.run(identity=)."),
    ("1.44.0", ["a", "b"], "installed 1.44.0: a version other than 1.45.2; missing a, b."),
])
def test_the_refusal_names_the_needed_and_installed_versions_and_what_is_missing(
        installed: str | None, absent: list[str], says: str) -> None:
    message = problem(claimwarden_version="9.9.9", installed=installed, absent=absent, pin="1.45.2")
    assert message is not None and "\n" not in message
    assert message.startswith("claimwarden 9.9.9 needs kopf==1.45.2 (it uses Kopf's private API")
    assert says in message


def test_the_pinned_version_with_nothing_missing_is_no_problem() -> None:
    assert problem(claimwarden_version="1", installed="1.45.2", absent=[], pin="1.45.2") is None


def test_check_reads_the_installed_version(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    monkeypatch.setattr(kopf_private.metadata, "version", lambda name: "1.46.0" if name == "kopf" else real(name))
    message = check("1.2.3")
    assert message is not None and "claimwarden 1.2.3 needs kopf==" in message and "installed 1.46.0" in message


# `claimwarden run` in a fresh interpreter that reports another Kopf version: nothing else is faked, and
# the run must stop before it reads any flag or kubeconfig.
RUN_WITH_ANOTHER_KOPF = """
import sys
from importlib import metadata
real = metadata.version
metadata.version = lambda name: "1.99.0" if name == "kopf" else real(name)
from claimwarden.cli import main
sys.exit(main(["run", "--kubeconfig", "/nonexistent"]))
"""


def test_claimwarden_run_with_another_kopf_exits_1_with_the_one_line_message() -> None:
    done = subprocess.run([sys.executable, "-c", RUN_WITH_ANOTHER_KOPF], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"claimwarden: claimwarden {__version__} needs kopf=={KOPF_PIN} (it uses Kopf's private API, which changes "
        f"without notice between releases); installed 1.99.0: a version other than {KOPF_PIN}. "
        f"Install kopf=={KOPF_PIN}, or a claimwarden release made for the Kopf you need"]


# The same with the pinned version but a private name gone (as a Kopf release that moved it): the door
# still imports, and the run stops with the name instead of an ImportError.
RUN_WITHOUT_IDENTITY = """
import sys
import kopf._core.engines.peering as peering
del peering.Identity
from claimwarden.cli import main
sys.exit(main(["run", "--kubeconfig", "/nonexistent"]))
"""


def test_claimwarden_run_with_a_private_name_gone_exits_1_naming_it() -> None:
    done = subprocess.run([sys.executable, "-c", RUN_WITHOUT_IDENTITY], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"claimwarden: claimwarden {__version__} needs kopf=={KOPF_PIN} (it uses Kopf's private")
    assert f"installed {KOPF_PIN}: missing kopf._core.engines.peering.Identity. Install" in line
