"""What the demo is given and what it works in: its options, its namespaces, its errors, the clone it runs from.

The constants here are the ones more than one scene (or a scene and the set-up) must agree on; a
value only one scene uses lives in that scene.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import cluster, driver

NAMESPACE = "demo"
CLAIMWARDEN_NAMESPACE = "claimwarden-system"
DEMO_NODES = 2
DEMO_GPUS_PER_NODE = 4
FALLBACK = ("H100", "A100")
MARK_PREFIX = "unhealthy.claimwarden.io/"
LOG_NAME = "claimwarden-demo"


class DemoError(RuntimeError):
    """A scene did not come out as narrated, or the demo cannot start; one line naming what and where."""


@dataclass(frozen=True)
class DemoOptions:
    dir: Path = field(default_factory=cluster.default_dir)
    pause: bool = False
    exit: bool = False
    models: str | None = None


def parse_models(text: str | None) -> list[str]:
    """``--models`` for the demo: the lab's models, which must include the fallback pair."""
    if not text:
        return []
    try:
        names = [m.name for m in driver.parse_models(text)]
    except driver.LabConfigError as exc:
        raise DemoError(str(exc)) from None
    missing = [m for m in FALLBACK if m not in names]
    if missing:
        raise DemoError(f"--models {text} lacks {', '.join(missing)}: the fallback scene shows "
                        f"{' -> '.join(FALLBACK)}; for example --models H100,A100,L4")
    return names


def repo_root() -> Path | None:
    """The clone this module runs from, if it is one (a wheel ships neither crds/ nor manifests/)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "crds" / "kustomization.yaml").is_file() else None
