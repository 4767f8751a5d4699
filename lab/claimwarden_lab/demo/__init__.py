"""`claimwarden lab demo`: the DRA walkthrough, a broken GPU and its recovery, narrated against the live lab.

The demo starts the lab (unless one already runs in ``--dir``) and claimwarden, then plays scenes.
Each command is introduced by a one-line explanation (``# ...``), printed as the user would type
it (``$ kubectl ...``), run for real with the lab's kubectl, and followed by its real output.
Between commands the demo never sleeps for pacing: it polls the API until the state the next
command shows has come, and fails with a one-line message naming what did not come when a timeout
passes. The demo also checks each outcome it narrates, so a demo that finishes told the truth.

Scenes: the cluster; the walkthrough's four experiments; a broken GPU (eviction, the record, a new
pod that waits because the only free device is the broken one); recovery; with ``--models``, a
prioritized list falling back from H100 to A100; what Prometheus would see.

Afterwards claimwarden keeps running in the foreground, streaming its log, until Ctrl-C (which
stops claimwarden and nothing else); ``--exit`` instead ends after the last scene and stops what
the demo started. Everything the scenes create lives in namespace ``demo``; a leftover ``demo``
namespace from an earlier run is removed first.

The package, by role: options.py (what the demo is given), narration.py and manifests.py (pure
text), stage.py (kubectl, waiting, reading the cluster), lifecycle.py (set-up and tear-down),
scenes/ (one scene per module), runner.py (the order of the scenes and the signals around them).

Part of the lab wing: ``claimwarden run`` never imports it.
"""

from .options import DemoError, DemoOptions
from .runner import run

__all__ = ["DemoError", "DemoOptions", "run"]
