"""A HealthPolicy's status: how claimwarden read it (the printer columns Rules, Enforced, Accepted).

One queue keyed by policy name. A reconcile parses the policy from the cache, asks the router whether it
could be routed (a CEL selector that does not compile, a DeviceClass that does not exist), and writes the
status subresource (``policy.desired_status``) only when it differs from what the object shows, with the
generation it read. Only the leader's workers run, and the write goes through the fenced Kube like every
other. A status write changes the policy's resourceVersion, not its generation: the devices are routed
again only when the generation changes (``SignalsController.policy_event``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping

from ..cache import Body, Cache, resource_version
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..runtime.workqueue import WorkQueue
from ..timestamps import now
from . import policy

log = logging.getLogger("claimwarden.signals")

POLICY_API = f"{policy.GROUP}/{policy.VERSION}"


class PolicyStatuses:
    """Writes each HealthPolicy's status; `route_errors` is the current router's errors by policy name."""

    def __init__(self, *, cache: Cache, kube: Kube, route_errors: Callable[[], Mapping[str, str]]) -> None:
        self.cache = cache
        self.kube = kube
        self.route_errors = route_errors
        self.queue = WorkQueue("healthpolicies")
        self._written: dict[str, tuple[int, Body]] = {}
        """Policy name -> (resourceVersion our last status write returned, that status), until the cache has it."""

    def enqueue(self, name: str) -> None:
        self.queue.add(name)

    def enqueue_all(self) -> None:
        for body in self.cache.health_policies():
            self.queue.add(str(body["metadata"]["name"]))

    async def reconcile(self, key: Hashable) -> None:
        name = str(key)
        body = next((b for b in self.cache.health_policies() if b["metadata"].get("name") == name), None)
        if body is None:
            self._written.pop(name, None)
            return
        status = dict(body.get("status") or {})
        written = self._written.get(name)
        if written is not None:
            if resource_version(body) < written[0]:
                status = {**status, **written[1]}  # the watch has not brought our last write back yet
            else:
                del self._written[name]
        desired = policy.desired_status({**body, "status": status}, self.route_errors().get(name), now())
        patch = policy.status_patch(status, desired)
        if patch is None:
            return
        try:
            result = await self.kube.merge_patch_cluster_object(POLICY_API, policy.PLURAL, name, patch,
                                                                subresource="status")
        except ApiError as exc:
            if exc.not_found:  # deleted meanwhile: its deletion event ends it
                return
            raise
        self._written[name] = (resource_version(result), desired)
        accepted = desired["conditions"][-1]
        log.info("HealthPolicy %s: Accepted=%s (%s)", name, accepted["status"], accepted["message"])
