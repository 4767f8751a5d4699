"""The soak's figures from plain samples: RSS slope per process, writes per object, queue depth over time."""

from __future__ import annotations

import pytest

from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from tests.chaos.soak_figures import (
    RssSample,
    WriteCounts,
    queue_depth_figures,
    queue_depths,
    rss_figures,
    slope,
)


def test_slope_is_the_least_squares_slope() -> None:
    assert slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2)
    assert slope([(0, 1), (1, 2), (2, 1), (3, 2)]) == pytest.approx(0.2)
    assert slope([(1, 5)]) == 0.0


def test_rss_slope_per_process_leaves_the_warm_up_out_and_a_restart_starts_a_new_life() -> None:
    # Replica a grows 100 MiB in its first minute (start-up), then 1 MiB every 10 minutes: 6 MiB an hour.
    samples = [RssSample(0, "a", 10, 50 * 1024), RssSample(30, "a", 10, 150 * 1024)]
    samples += [RssSample(60 + 600 * i, "a", 10, (150 + i) * 1024) for i in range(4)]
    samples += [RssSample(3000 + 60 * i, "a", 11, 100 * 1024) for i in range(5)]  # restarted: flat
    first, second = rss_figures(samples)
    assert (first["pid"], first["first_mib"], first["max_mib"]) == (10, 50.0, 153.0)
    assert first["slope_mib_per_hour"] == pytest.approx(6.0)
    assert second["pid"] == 11 and second["slope_mib_per_hour"] == 0.0
    assert rss_figures([RssSample(0, "b", 1, 1024)])[0]["slope_mib_per_hour"] is None


def _write(verb: str, resource: str, name: str | None, *, subresource: str | None = None,
           user: str = CLAIMWARDEN_USER) -> dict[str, object]:
    ref = {"resource": resource, "namespace": "ns", "name": name, "subresource": subresource}
    return {"stage": "ResponseComplete", "verb": verb, "user": {"username": user}, "objectRef": ref}


def test_writes_per_object_by_resource() -> None:
    counts = WriteCounts()
    counts.add([_write("create", "resourceclaims", None), _write("patch", "resourceclaims", "c1", subresource="status"),
                _write("patch", "resourceclaims", "c1", subresource="status"), _write("delete", "resourceclaims", "c1"),
                {**_write("patch", "resourceclaims", "c2", subresource="status"), "responseStatus": {"code": 409}},
                _write("create", "pods", "p1", subresource="eviction"),
                _write("update", "leases", "claimwarden"), _write("patch", "pods", "p1", user="someone-else"),
                {**_write("patch", "pods", "p1"), "stage": "RequestReceived"}])
    evictions, claims = counts.figures()
    assert claims == {"resource": "resourceclaims", "objects": 3, "writes": 5, "writes_per_object": 1.67, "max": 3,
                      "max_object": "ns/c1", "by_verb": {"patch status": 3, "create": 1, "delete": 1},
                      "refused": {409: 1}}
    assert evictions["resource"] == "pods/eviction" and evictions["writes"] == 1


def test_queue_depth_over_time() -> None:
    samples = [(0, "claims", 0), (30, "claims", 40), (70, "claims", 5), (130, "claims", 0), (10, "health", 1)]
    figures = queue_depth_figures(samples)
    assert figures["claims"]["max"] == 40 and figures["claims"]["last"] == 0
    assert figures["claims"]["max_per_60s"] == [40, 5, 0]
    assert figures["health"]["mean"] == 1


def test_queue_depths_read_from_metrics() -> None:
    page = ('# HELP claimwarden_workqueue_depth Keys waiting\n'
            'claimwarden_workqueue_depth{controller="claims"} 3.0\n'
            'claimwarden_workqueue_depth{controller="health"} 0.0\n'
            'claimwarden_workqueue_adds_total{controller="x"} 9\n')
    assert queue_depths(page) == {"claims": 3.0, "health": 0.0}
