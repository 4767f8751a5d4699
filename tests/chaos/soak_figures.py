"""The soak's figures, from plain samples: RSS slope per replica, writes per object, queue depth over time.

Pure functions; test_soak.py collects the samples from the lab and claimwarden's /metrics.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.integration.auditor import CLAIMWARDEN_USER

WRITE_VERBS = ("create", "update", "patch", "delete")
RSS_WARM_UP_SECONDS = 60.0
"""Samples of a process's first minute are left out of its slope: start-up (the first list) is not a leak."""


@dataclass(frozen=True)
class RssSample:
    at: float
    """Seconds since the soak started."""
    replica: str
    pid: int
    kib: int


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of (x, y) points (0 for fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return 0.0
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)


def rss_figures(samples: Iterable[RssSample]) -> list[dict[str, Any]]:
    """Per replica and process (a killed replica starts a new one): minutes sampled, first and last RSS and
    the slope in MiB per hour after the warm-up."""
    lives: dict[tuple[str, int], list[RssSample]] = defaultdict(list)
    for sample in samples:
        lives[(sample.replica, sample.pid)].append(sample)
    figures = []
    for (replica, pid), found in sorted(lives.items(), key=lambda item: item[1][0].at):
        found.sort(key=lambda s: s.at)
        warm = [s for s in found if s.at - found[0].at >= RSS_WARM_UP_SECONDS]
        figures.append({
            "replica": replica, "pid": pid, "from_minute": round(found[0].at / 60, 1),
            "minutes": round((found[-1].at - found[0].at) / 60, 1),
            "first_mib": round(found[0].kib / 1024, 1), "last_mib": round(found[-1].kib / 1024, 1),
            "max_mib": round(max(s.kib for s in found) / 1024, 1),
            "slope_mib_per_hour": round(slope([(s.at / 3600, s.kib / 1024) for s in warm]), 1) if len(warm) >= 3
            else None})
    return figures


class WriteCounts:
    """claimwarden's writes per object, counted from audit events as they are read (the events themselves
    need not be kept)."""

    def __init__(self) -> None:
        self.per_object: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
        self.unnamed_creates: Counter[str] = Counter()
        self.by_verb: dict[str, Counter[str]] = defaultdict(Counter)
        self.refused: dict[str, Counter[int]] = defaultdict(Counter)
        """Writes answered with an error, by code (a conflict, a precondition, a 404): sent, so counted, and apart."""

    def add(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            ref = event.get("objectRef") or {}
            if (event.get("stage") != "ResponseComplete" or (event.get("user") or {}).get("username")
                    != CLAIMWARDEN_USER or event.get("verb") not in WRITE_VERBS or ref.get("resource") == "leases"):
                continue
            kind = str(ref.get("resource")) + (f"/{ref['subresource']}" if ref.get("subresource") == "eviction" else "")
            verb = str(event.get("verb")) + (f" {ref['subresource']}" if ref.get("subresource") else "")
            self.by_verb[kind][verb] += 1
            code = int((event.get("responseStatus") or {}).get("code") or 200)
            if code >= 300:
                self.refused[kind][code] += 1
            if not ref.get("name"):  # a create with generateName: one new object
                self.unnamed_creates[kind] += 1
                continue
            self.per_object[kind][(str(ref.get("namespace") or ""), str(ref["name"]))] += 1

    def figures(self) -> list[dict[str, Any]]:
        """Per resource: objects written, writes, mean and max writes per object (a create with generateName
        counts as one write to one object of its own)."""
        figures = []
        for kind in sorted(set(self.per_object) | set(self.unnamed_creates)):
            counts = list(self.per_object[kind].values())
            objects, writes = len(counts), sum(counts)
            worst = self.per_object[kind].most_common(1)
            figures.append({
                "resource": kind, "objects": objects + self.unnamed_creates[kind],
                "writes": writes + self.unnamed_creates[kind],
                "writes_per_object": round((writes + self.unnamed_creates[kind])
                                           / max(1, objects + self.unnamed_creates[kind]), 2),
                "max": worst[0][1] if worst else 1,
                "max_object": "/".join(p for p in worst[0][0] if p) if worst else "",
                "by_verb": dict(self.by_verb[kind].most_common()), "refused": dict(self.refused[kind].most_common())})
        return figures


def queue_depth_figures(samples: Iterable[tuple[float, str, float]], bucket: float = 60.0) -> dict[str, Any]:
    """(seconds since start, controller, depth) -> per controller: max, mean, p95, last, and the max per
    `bucket` seconds (the series over time)."""
    by_controller: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for at, controller, depth in samples:
        by_controller[controller].append((at, depth))
    figures: dict[str, Any] = {}
    for controller, points in sorted(by_controller.items()):
        points.sort()
        depths = sorted(d for _, d in points)
        series: dict[int, float] = {}
        for at, depth in points:
            series[int(at // bucket)] = max(series.get(int(at // bucket), 0.0), depth)
        figures[controller] = {
            "max": max(depths), "mean": round(statistics.fmean(depths), 1),
            "p95": depths[min(len(depths) - 1, int(0.95 * len(depths)))], "last": points[-1][1],
            f"max_per_{int(bucket)}s": [series.get(i, 0.0) for i in range(int(points[-1][0] // bucket) + 1)]}
    return figures


def queue_depths(metrics_text: str) -> dict[str, float]:
    """claimwarden_workqueue_depth per controller from a /metrics page."""
    found = {}
    for line in metrics_text.splitlines():
        if line.startswith("claimwarden_workqueue_depth{"):
            labels, _, value = line.rpartition(" ")
            controller = labels.split('controller="', 1)[1].split('"', 1)[0]
            found[controller] = float(value)
    return found
