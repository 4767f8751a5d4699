"""How the process ends when it must end and Kopf would not end it.

Two cases, both by `os._exit(1)` so that the kubelet restarts the process afresh:

- the lease is lost (`lost_lease`): writes in flight are fenced already, and the restart comes back
  as a standby, as client-go's controllers do;
- Kopf's clean-up ran but the process did not end (`exit_unless_ended`): when Kopf's orchestrator
  failed instead of being signalled (a watched API version no longer served after an upgrade), one
  of its watchers may go on waiting to re-authenticate, and the process stayed up with no
  controller running (seen in the lab on 1.37.2). The restart discovers the versions served now.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("claimwarden")

EXIT_AFTER_CLEANUP = 30.0
"""Seconds after the clean-up by which the process has ended. On a signal Kopf ends it at once."""


def lost_lease() -> None:
    """Stop at once, as client-go's controllers do: the writes in flight are fenced, the kubelet restarts
    this process as a standby."""
    logging.shutdown()
    os._exit(1)


def exit_unless_ended(seconds: float = EXIT_AFTER_CLEANUP) -> None:
    """Exit with 1 unless the process has ended `seconds` from now."""
    def exit_now() -> None:
        log.error("Kopf had not ended the process %g s after the clean-up; exiting", seconds)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True  # an ordinary end of the process does not wait for it
    timer.start()
