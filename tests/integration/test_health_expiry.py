"""A record expires on time whatever RFC 3339 spelling its expiresAt uses (the API server keeps it verbatim)."""

from __future__ import annotations

import datetime
import time

from kubernetes import client

from claimwarden.runtime import operator as runtime

from .health_helpers import create_record, delete_record, holders, record_for
from .helpers import wait_for
from .operator import Operator


def test_a_lower_case_expiry_clears_the_record_on_time(api: client.ApiClient, claimwarden: Operator) -> None:
    # Past claimwarden's first resync, so only the wake-up at the expiry itself can remove the record in time.
    time.sleep(runtime.FIRST_RESYNC_SECONDS + 1)
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=4)
    name = "expiring-lower-case"
    create_record(api, name, "kwok-node-1", "gpu-6", "NoSchedule", "maintenance window",
                  expiresAt=soon.strftime("%Y-%m-%dt%H:%M:%Sz"))
    try:
        wait_for("the record quarantined", lambda: holders(api, "kwok-node-1", "gpu-6"))
        wait_for("the record gone after its expiry", lambda: record_for(api, "kwok-node-1", "gpu-6") is None, 15)
    finally:
        if record_for(api, "kwok-node-1", "gpu-6") is not None:
            delete_record(api, name)
