"""One view per event (objects/pods.py `pod_view`, objects/claims.py `claim_view`), and the claims created
but not cached yet that the pod and PodGroup controllers share (claims/creations.py)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from claimwarden.claims import creations
from claimwarden.objects.claims import claim_view
from claimwarden.objects.pods import pod_view


def _pod(*, entries: list[dict[str, Any]], extended: str | None = None,
         recorded: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"resourceClaimStatuses": [{"name": k, "resourceClaimName": v}
                                                        for k, v in (recorded or {}).items()]}
    if extended:
        status["extendedResourceClaimStatus"] = {"resourceClaimName": extended}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"resourceClaims": entries},
            "status": status}


def test_a_pod_without_claims_has_no_view() -> None:
    assert pod_view("ns", "p", kopf.Body(_pod(entries=[]))) is None


def test_a_pod_view_resolves_its_claim_names_once_from_spec_status_and_extended_claim() -> None:
    body = _pod(entries=[{"name": "a", "resourceClaimName": "shared"},
                         {"name": "b", "resourceClaimTemplateName": "t"},
                         {"name": "c", "resourceClaimTemplateName": "t"}],
                recorded={"b": "p-b-x"}, extended="p-extended")
    view = pod_view(None, "p", kopf.Body(body), deleted=True)
    assert view is not None
    assert (view.namespace, view.name, view.uid, view.deleted) == ("", "p", "u1", True)
    assert view.claim_names == ("shared", "p-b-x", "p-extended")  # "c" is not generated yet
    assert view.lists_claims
    assert view.body == body and view.body is not body  # one plain copy


def test_a_pod_with_only_an_extended_resource_claim_lists_none_in_its_spec() -> None:
    view = pod_view("ns", "p", _pod(entries=[], extended="p-extended"))
    assert view is not None
    assert view.claim_names == ("p-extended",)
    assert not view.lists_claims  # the claims controller has nothing to create for it


def test_a_claim_view_copies_the_body_once() -> None:
    body = {"metadata": {"name": "c", "namespace": "ns"}}
    view = claim_view("ns", "c", kopf.Body(body))
    assert (view.namespace, view.name, view.deleted) == ("ns", "c", False)
    assert view.body == body and isinstance(view.body, dict)
    with pytest.raises(AttributeError):
        view.name = "other"  # type: ignore[misc]


def _claim(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {}}


def test_a_created_claim_is_seen_until_the_cache_shows_it() -> None:
    recents: creations.Recents = {}
    creations.remember_created(recents, "owner", _claim("c1"))
    assert [c["metadata"]["name"] for c in creations.with_recent([], recents, "owner")] == ["c1"]
    cached = [_claim("c1")]
    assert creations.with_recent(cached, recents, "owner") == cached
    assert recents == {}  # forgotten once cached


def test_a_created_claim_is_forgotten_after_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    recents: creations.Recents = {}
    creations.remember_created(recents, "owner", _claim("c1"))
    later = creations.time.monotonic() + creations.RECENT_TTL + 1
    monkeypatch.setattr(creations.time, "monotonic", lambda: later)
    assert creations.with_recent([], recents, "owner") == []
    assert recents == {}
