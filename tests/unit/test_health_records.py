"""UnhealthyDevice records: names, fields, expiry, slice annotations and the slice sync plan."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from claimwarden.health.records import (
    ANNOTATION_PREFIX,
    DRAIN_ANNOTATION_PREFIX,
    SLICE_LABEL,
    SOURCE_ANNOTATION,
    DeviceRef,
    Drain,
    expiry_error,
    is_expired,
    label_value,
    parse_drain,
    record_drain,
    record_effect,
    record_name,
    record_ref,
)
from claimwarden.health.slice_marks import (
    MarkError,
    SliceMark,
    SliceSync,
    parse_slice_marks,
    plan_slice,
    record_body,
)

SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DRIVER = "gpu.example.com"
POOL = "node-1"
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def is_subdomain(name: str) -> bool:
    return len(name) <= 253 and bool(SUBDOMAIN.match(name))


def make_slice(annotations: dict[str, str] | None = None, *, name: str = "slice-a",
               devices: tuple[str, ...] = ("gpu-0", "gpu-1", "gpu-2"), driver: str = DRIVER,
               pool: str = POOL) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {"driver": driver, "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                 "nodeName": "node-1", "devices": [{"name": device} for device in devices]},
    }


def mark(device: str) -> str:
    return f"{ANNOTATION_PREFIX}{device}"


def existing(device: str, reason: str = "broken", *, source: str | None = SOURCE_ANNOTATION,
             slice_name: str | None = "slice-a", driver: str = DRIVER, pool: str = POOL,
             name: str | None = None) -> tuple[str, dict[str, Any]]:
    ref = DeviceRef(driver, pool, device)
    record_spec: dict[str, Any] = {"driver": driver, "pool": pool, "device": device, "effect": "NoExecute",
                                   "reason": reason}
    if source is not None:
        record_spec["source"] = source
    record_name_ = name or record_name(ref)
    labels = {SLICE_LABEL: slice_name} if slice_name else {}
    return record_name_, {"metadata": {"name": record_name_, "labels": labels}, "spec": record_spec}


# --- record_name --------------------------------------------------------------------------------

def test_record_name_is_readable_and_valid() -> None:
    name = record_name(DeviceRef(DRIVER, POOL, "gpu-0"))
    assert re.fullmatch(r"node-1\.gpu-0\.[0-9a-f]{8}", name)
    assert is_subdomain(name)


def test_record_name_is_stable() -> None:
    assert record_name(DeviceRef(DRIVER, POOL, "gpu-0")) == record_name(DeviceRef(DRIVER, POOL, "gpu-0"))


def test_record_name_differs_per_driver_pool_and_device() -> None:
    names = {
        record_name(DeviceRef(DRIVER, POOL, "gpu-0")),
        record_name(DeviceRef("other.example.com", POOL, "gpu-0")),
        record_name(DeviceRef(DRIVER, "node-2", "gpu-0")),
        record_name(DeviceRef(DRIVER, POOL, "gpu-1")),
    }
    assert len(names) == 4


@pytest.mark.parametrize(("pool", "device"), [
    ("Node_1/Rack:7", "GPU-0"),
    ("pool..with..dots", "gpu-0"),
    ("-leading-and-trailing-", "-x-"),
    (".", "gpu-0"),
    ("///", "***"),
    ("", ""),
    ("a" * 300, "gpu-0"),
    ("p." * 200, "d" * 100),
    ("a" * 243 + "-b", "gpu-0"),
])
def test_record_name_is_always_a_valid_subdomain(pool: str, device: str) -> None:
    name = record_name(DeviceRef(DRIVER, pool, device))
    assert is_subdomain(name), name


def test_record_name_of_long_pool_is_truncated_but_keeps_device_and_hash() -> None:
    name = record_name(DeviceRef(DRIVER, "a" * 400, "gpu-7"))
    assert len(name) == 253
    assert re.fullmatch(r"a+\.gpu-7\.[0-9a-f]{8}", name)


def test_record_name_keeps_truncated_names_distinct() -> None:
    assert record_name(DeviceRef(DRIVER, "a" * 400 + "x", "gpu-0")) != record_name(DeviceRef(DRIVER, "a" * 401,
                                                                                            "gpu-0"))


def test_record_name_lowercases_and_replaces_invalid_characters() -> None:
    name = record_name(DeviceRef(DRIVER, "Rack/Node_1", "gpu-0"))
    assert name.startswith("rack-node-1.gpu-0.")


# --- label_value --------------------------------------------------------------------------------

def test_label_value_keeps_short_names() -> None:
    assert label_value("slice-a") == "slice-a"
    assert label_value("node-1.gpu-0.0123abcd") == "node-1.gpu-0.0123abcd"


@pytest.mark.parametrize("name", ["x" * 64, "a." * 100, "-odd-", "ns/name", "x" * 54 + "." + "y" * 20])
def test_label_value_is_always_valid(name: str) -> None:
    value = label_value(name)
    assert len(value) <= 63
    assert LABEL_VALUE.match(value), value


def test_label_value_of_long_names_stays_distinct() -> None:
    assert label_value("x" * 100 + "1") != label_value("x" * 100 + "2")


# --- record fields ------------------------------------------------------------------------------

def test_record_ref_and_missing_fields() -> None:
    record = {"spec": {"driver": DRIVER, "pool": POOL, "device": "gpu-0"}}
    assert record_ref(record) == DeviceRef(DRIVER, POOL, "gpu-0")
    assert record_ref({"spec": {"driver": DRIVER, "pool": POOL}}) is None
    assert record_ref({"spec": {"driver": DRIVER, "device": "gpu-0"}}) is None
    assert record_ref({}) is None


def test_device_ref_is_hashable_and_frozen() -> None:
    ref = DeviceRef(DRIVER, POOL, "gpu-0")
    assert {ref: 1}[DeviceRef(DRIVER, POOL, "gpu-0")] == 1
    with pytest.raises(AttributeError):
        ref.device = "gpu-1"  # type: ignore[misc]


def test_record_effect_defaults_to_no_execute() -> None:
    assert record_effect({}) == "NoExecute"
    assert record_effect({"spec": {"effect": "None"}}) == "None"
    assert record_effect({"spec": {"effect": "NoSchedule"}}) == "NoSchedule"


@pytest.mark.parametrize(("expires", "expired"), [
    ("2025-06-01T11:59:59Z", True),
    ("2025-06-01T12:00:00Z", True),
    ("2025-06-01T12:00:01Z", False),
    ("2025-06-01T13:30:00+02:00", True),
    ("2025-06-01T12:30:00.123456z", False),
    ("2025-06-01t11:00:00.5Z", True),
])
def test_is_expired(expires: str, expired: bool) -> None:
    record = {"spec": {"expiresAt": expires}}
    assert is_expired(record, NOW) is expired
    assert expiry_error(record) is None


def test_no_expiry_never_expires() -> None:
    assert is_expired({"spec": {}}, NOW) is False
    assert is_expired({}, NOW) is False
    assert expiry_error({}) is None


@pytest.mark.parametrize("expires", ["tomorrow", "2025-06-01", "2025-06-01T11:00:00", "2025-13-01T00:00:00Z", 17])
def test_unparsable_expiry_counts_as_not_expired(expires: Any) -> None:
    record = {"spec": {"expiresAt": expires}}
    assert is_expired(record, NOW + timedelta(days=3650)) is False
    error = expiry_error(record)
    assert error is not None and "RFC 3339" in error


def test_is_expired_accepts_naive_now_as_utc() -> None:
    assert is_expired({"spec": {"expiresAt": "2025-06-01T11:00:00Z"}}, NOW.replace(tzinfo=None)) is True


# --- parse_slice_marks --------------------------------------------------------------------------

def test_parse_valid_marks_sorted_by_device() -> None:
    slice_ = make_slice({mark("gpu-2"): "ECC errors", mark("gpu-0"): "  fell off the bus  ", "other/key": "x"})
    marks, errors = parse_slice_marks(slice_)
    assert errors == []
    assert marks == [
        SliceMark(DeviceRef(DRIVER, POOL, "gpu-0"), "fell off the bus", "slice-a"),
        SliceMark(DeviceRef(DRIVER, POOL, "gpu-2"), "ECC errors", "slice-a"),
    ]


def test_parse_without_annotations() -> None:
    assert parse_slice_marks({"metadata": {"name": "s"}, "spec": {}}) == ([], [])
    assert parse_slice_marks({}) == ([], [])


@pytest.mark.parametrize("key", [
    "unhealthy.claimwarden.io",
    "x.unhealthy.claimwarden.io/gpu-0",
    "claimwarden.io/unhealthy",
    "Unhealthy.claimwarden.io/gpu-0",
    "example.com/gpu-0",
])
def test_foreign_keys_are_ignored(key: str) -> None:
    assert parse_slice_marks(make_slice({key: "reason"})) == ([], [])


@pytest.mark.parametrize("device", ["", "GPU-0", "gpu.0", "gpu_0", "-gpu", "gpu-", "g" * 64])
def test_malformed_device_part_is_an_error(device: str) -> None:
    key = mark(device)
    marks, errors = parse_slice_marks(make_slice({key: "reason"}))
    assert marks == []
    assert len(errors) == 1
    error = errors[0]
    assert (error.slice_name, error.key) == ("slice-a", key)
    assert key in error.message
    assert "unhealthy.claimwarden.io/" in error.message and "device name" in error.message


def test_unknown_device_is_an_error_listing_the_slice_devices() -> None:
    marks, errors = parse_slice_marks(make_slice({mark("gpu-9"): "reason"}))
    assert marks == []
    assert len(errors) == 1
    message = errors[0].message
    assert "'gpu-9'" in message and "'slice-a'" in message
    assert "gpu-0, gpu-1, gpu-2" in message


def test_unknown_device_message_lists_at_most_ten_devices() -> None:
    devices = tuple(f"dev-{i:02d}" for i in range(15))
    _, errors = parse_slice_marks(make_slice({mark("gpu-9"): "reason"}, devices=devices))
    message = errors[0].message
    assert "dev-09" in message and "dev-10" not in message
    assert "(and 5 more)" in message


def test_unknown_device_in_empty_slice() -> None:
    _, errors = parse_slice_marks(make_slice({mark("gpu-0"): "reason"}, devices=()))
    assert "no devices" in errors[0].message


@pytest.mark.parametrize("value", ["", "   ", "\n\t"])
def test_empty_reason_is_an_error(value: str) -> None:
    marks, errors = parse_slice_marks(make_slice({mark("gpu-0"): value}))
    assert marks == []
    assert len(errors) == 1
    assert "value must be the reason" in errors[0].message


def test_reason_too_long_is_an_error() -> None:
    marks, errors = parse_slice_marks(make_slice({mark("gpu-0"): "x" * 1025, mark("gpu-1"): "y" * 1024}))
    assert [m.ref.device for m in marks] == ["gpu-1"]
    assert [e.key for e in errors] == [mark("gpu-0")]
    assert "1024" in errors[0].message


def test_valid_and_invalid_marks_together() -> None:
    slice_ = make_slice({mark("gpu-1"): "bad", mark("GPU"): "bad", mark("gpu-7"): "bad", mark("gpu-0"): ""})
    marks, errors = parse_slice_marks(slice_)
    assert [m.ref.device for m in marks] == ["gpu-1"]
    assert [e.key for e in errors] == sorted([mark("GPU"), mark("gpu-7"), mark("gpu-0")])


def test_slice_without_driver_or_pool_is_an_error() -> None:
    slice_ = make_slice({mark("gpu-0"): "bad"})
    slice_["spec"]["pool"] = {}
    marks, errors = parse_slice_marks(slice_)
    assert marks == [] and len(errors) == 1


# --- record_body --------------------------------------------------------------------------------

def test_record_body() -> None:
    ref = DeviceRef(DRIVER, POOL, "gpu-0")
    body = record_body(SliceMark(ref, "ECC errors", "slice-a"))
    assert body == {
        "apiVersion": "claimwarden.io/v1alpha1",
        "kind": "UnhealthyDevice",
        "metadata": {"name": record_name(ref), "labels": {SLICE_LABEL: "slice-a"}},
        "spec": {"driver": DRIVER, "pool": POOL, "device": "gpu-0", "effect": "NoExecute",
                 "reason": "ECC errors", "source": "annotation", "drain": "Immediate"},
    }
    assert record_ref(body) == ref


def test_record_body_of_long_slice_name_has_valid_label() -> None:
    body = record_body(SliceMark(DeviceRef(DRIVER, POOL, "gpu-0"), "r", "s" * 200))
    value = body["metadata"]["labels"][SLICE_LABEL]
    assert len(value) <= 63 and value == label_value("s" * 200)


# --- plan_slice ---------------------------------------------------------------------------------

def test_plan_slice_creates_missing_records() -> None:
    sync = plan_slice(make_slice({mark("gpu-0"): "ECC", mark("gpu-1"): "hot"}), {})
    assert [body["spec"]["device"] for body in sync.create] == ["gpu-0", "gpu-1"]
    assert sync.update_reason == () and sync.delete == () and sync.errors == ()


def test_plan_slice_nothing_to_do_when_in_step() -> None:
    records = dict([existing("gpu-0", "ECC")])
    assert plan_slice(make_slice({mark("gpu-0"): "ECC"}), records) == SliceSync()


def test_plan_slice_updates_changed_reason() -> None:
    name, record = existing("gpu-0", "ECC")
    sync = plan_slice(make_slice({mark("gpu-0"): "ECC and heat"}), {name: record})
    assert sync.update_reason == ((name, "ECC and heat"),)
    assert sync.create == () and sync.delete == ()


def test_plan_slice_leaves_manual_record_alone() -> None:
    name, record = existing("gpu-0", "admin said so", source="manual", slice_name=None)
    sync = plan_slice(make_slice({mark("gpu-0"): "ECC"}), {name: record})
    assert sync == SliceSync()


def test_plan_slice_record_without_source_counts_as_manual() -> None:
    name, record = existing("gpu-0", "admin said so", source=None, slice_name=None)
    assert plan_slice(make_slice({mark("gpu-0"): "ECC"}), {name: record}) == SliceSync()


def test_plan_slice_finds_manual_record_under_another_name() -> None:
    name, record = existing("gpu-0", "admin", source="manual", slice_name=None, name="my-broken-gpu")
    sync = plan_slice(make_slice({mark("gpu-0"): "ECC"}), {name: record})
    assert sync == SliceSync()


def test_plan_slice_deletes_record_when_unmarked() -> None:
    records = dict([existing("gpu-0"), existing("gpu-1")])
    sync = plan_slice(make_slice({mark("gpu-1"): "broken"}), records)
    assert sync.delete == (record_name(DeviceRef(DRIVER, POOL, "gpu-0")),)
    assert sync.create == () and sync.update_reason == ()


def test_plan_slice_never_deletes_manual_records() -> None:
    records = dict([existing("gpu-0", source="manual")])
    assert plan_slice(make_slice({}), records).delete == ()


def test_plan_slice_never_touches_other_slices_records() -> None:
    records = dict([existing("gpu-0", slice_name="slice-b")])
    assert plan_slice(make_slice({}), records) == SliceSync()


def test_plan_slice_keeps_records_of_devices_it_does_not_list() -> None:
    records = dict([existing("gpu-5")])
    assert plan_slice(make_slice({}), records).delete == ()


def test_plan_slice_keeps_records_of_other_pools_and_drivers() -> None:
    records = dict([existing("gpu-0", pool="node-2"), existing("gpu-0", driver="other.example.com")])
    assert plan_slice(make_slice({}), records).delete == ()


def test_plan_slice_keeps_record_while_annotation_is_invalid() -> None:
    records = dict([existing("gpu-0")])
    sync = plan_slice(make_slice({mark("gpu-0"): "  "}), records)
    assert sync.delete == () and sync.create == () and sync.update_reason == ()
    assert [e.key for e in sync.errors] == [mark("gpu-0")]


def test_plan_slice_reports_errors() -> None:
    sync = plan_slice(make_slice({mark("nope"): "x"}), {})
    assert sync.errors == (MarkError("slice-a", mark("nope"), sync.errors[0].message),)
    assert sync.create == ()


def test_plan_slice_long_slice_name_matches_its_own_label() -> None:
    long_name = "s" * 100
    name, record = existing("gpu-0", slice_name=label_value(long_name))
    sync = plan_slice(make_slice({}, name=long_name), {name: record})
    assert sync.delete == (name,)


def test_gone_slice_deletes_nothing() -> None:
    """A slice that is gone is never planned; an empty slice of the same name deletes nothing it does not list."""
    records = dict([existing("gpu-0")])
    assert plan_slice(make_slice({}, devices=()), records) == SliceSync()


# --- a re-created slice: records follow the slice that carries the mark ------------------------

def test_a_mark_on_a_recreated_slice_adopts_the_record_and_relabels_it() -> None:
    """The old slice is gone; the device is marked again on the new one (code review finding 5)."""
    name, record = existing("gpu-0", "XID 79")
    sync = plan_slice(make_slice({mark("gpu-0"): "XID 79"}, name="slice-b"), {name: record})
    assert sync.relabel == ((name, "slice-b"),)
    assert sync.create == () and sync.delete == () and sync.update_reason == ()


def test_removing_the_mark_from_the_recreated_slice_clears_the_adopted_record() -> None:
    name, record = existing("gpu-0", "XID 79")
    sync = plan_slice(make_slice({mark("gpu-0"): "XID 79"}, name="slice-b"), {name: record})
    relabelled = {**record, "metadata": {**record["metadata"], "labels": {SLICE_LABEL: sync.relabel[0][1]}}}
    assert plan_slice(make_slice({}, name="slice-b"), {name: relabelled}).delete == (name,)


def test_a_recreated_slice_without_the_mark_keeps_the_record() -> None:
    """Records outlive their slice: a driver re-publishing its devices does not clear a mark."""
    records = dict([existing("gpu-0")])
    assert plan_slice(make_slice({}, name="slice-b"), records) == SliceSync()
    old = make_slice({}, name="slice-a", devices=())  # the old slice, emptied before it is deleted
    assert plan_slice(make_slice({}, name="slice-b"), records, [old]) == SliceSync()


def test_a_record_stays_with_its_slice_while_that_slice_still_carries_the_mark() -> None:
    """Both slices of the pool exist and carry the mark: neither takes the record from the other."""
    name, record = existing("gpu-0")
    old = make_slice({mark("gpu-0"): "broken"}, name="slice-a")
    new = make_slice({mark("gpu-0"): "broken"}, name="slice-b")
    assert plan_slice(new, {name: record}, [old, new]) == SliceSync()
    assert plan_slice(old, {name: record}, [old, new]) == SliceSync()


def test_a_record_is_not_cleared_while_another_slice_of_the_pool_carries_the_mark() -> None:
    """The mark is removed from the record's slice while the other slice of the pool still has it:
    the record follows that slice (and removing the mark there clears it)."""
    name, record = existing("gpu-0")
    old = make_slice({}, name="slice-a")
    new = make_slice({mark("gpu-0"): "broken"}, name="slice-b")
    sync = plan_slice(old, {name: record}, [old, new])
    assert sync.delete == () and sync.relabel == ((name, "slice-b"),)
    moved = {**record, "metadata": {**record["metadata"], "labels": {SLICE_LABEL: "slice-b"}}}
    assert plan_slice(old, {name: moved}, [old, new]) == SliceSync()
    assert plan_slice(new, {name: moved}, [old, new]) == SliceSync()
    gone = make_slice({}, name="slice-b")
    assert plan_slice(gone, {name: moved}, [old, gone]).delete == (name,)


def test_a_record_follows_the_first_carrying_slice_by_name_and_then_stays() -> None:
    name, record = existing("gpu-0", slice_name="slice-gone")
    here = make_slice({}, name="slice-a")
    others = [make_slice({mark("gpu-0"): "broken"}, name=n) for n in ("slice-c", "slice-b")]
    assert plan_slice(here, {name: record}, [here, *others]).relabel == ((name, "slice-b"),)


def test_slices_of_other_pools_or_drivers_do_not_keep_a_record() -> None:
    name, record = existing("gpu-0")
    other_pool = make_slice({mark("gpu-0"): "broken"}, name="slice-x", pool="node-2")
    other_driver = make_slice({mark("gpu-0"): "broken"}, name="slice-y", driver="other.example.com")
    assert plan_slice(make_slice({}), {name: record}, [other_pool, other_driver]).delete == (name,)


def test_a_stray_mark_on_a_slice_that_does_not_list_the_device_does_not_take_the_record() -> None:
    """Passed to such a slice, the record would never be cleared: that slice skips devices it does not list."""
    name, record = existing("gpu-0")
    here = make_slice({})
    stray = make_slice({mark("gpu-0"): "broken"}, name="slice-s", devices=("gpu-1",))
    assert plan_slice(here, {name: record}, [here, stray]).delete == (name,)


def test_a_manual_record_is_never_relabelled() -> None:
    name, record = existing("gpu-0", source="manual", slice_name="slice-a")
    assert plan_slice(make_slice({mark("gpu-0"): "ECC"}, name="slice-b"), {name: record}) == SliceSync()


# --- drain modes --------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "drain"), [
    ("Immediate", Drain("Immediate")),
    ("AllowCompletion", Drain("AllowCompletion")),
    ("Node", Drain("Node")),
    ("EvictAfter=30m", Drain("EvictAfter", timedelta(minutes=30))),
    ("EvictAfter=1h30m", Drain("EvictAfter", timedelta(hours=1, minutes=30))),
    ("EvictAfter=45s", Drain("EvictAfter", timedelta(seconds=45))),
    ("EvictAfter=0s", Drain("EvictAfter", timedelta(0))),
    # Go's grammar (issue 23 item 8): parts in any order, fractions, a bare 0
    ("EvictAfter=30m10h", Drain("EvictAfter", timedelta(hours=10, minutes=30))),
    ("EvictAfter=1.5h", Drain("EvictAfter", timedelta(hours=1, minutes=30))),
    ("EvictAfter=0", Drain("EvictAfter", timedelta(0))),
])
def test_parse_drain(text: str, drain: Drain) -> None:
    assert parse_drain(text) == drain
    assert parse_drain(str(drain)) == drain


@pytest.mark.parametrize("text", ["", "immediate", "EvictAfter", "EvictAfter=", "EvictAfter=30", "EvictAfter=2d",
                                  "EvictAfter=-1m", "EvictAfter=1d", "EvictAfter: 30m", "Never", "node"])
def test_parse_drain_refuses(text: str) -> None:
    assert parse_drain(text) is None


def test_record_drain_defaults_to_immediate_and_a_bad_value_evicts_nothing() -> None:
    assert record_drain({"spec": {}}) == Drain("Immediate")
    assert record_drain({"spec": {"drain": "EvictAfter=1m"}}) == Drain("EvictAfter", timedelta(minutes=1))
    assert record_drain({"spec": {"drain": "bogus"}}) == Drain("AllowCompletion")


def test_a_drain_annotation_goes_into_the_mark() -> None:
    slice_ = make_slice({mark("gpu-0"): "ECC", DRAIN_ANNOTATION_PREFIX + "gpu-0": "EvictAfter=90m",
                         mark("gpu-1"): "hot", DRAIN_ANNOTATION_PREFIX + "gpu-2": "AllowCompletion"})
    marks, errors = parse_slice_marks(slice_)
    assert errors == []
    assert [(m.ref.device, m.drain) for m in marks] == [("gpu-0", "EvictAfter=1h30m"), ("gpu-1", "Immediate")]
    assert plan_slice(slice_, {}).create[0]["spec"]["drain"] == "EvictAfter=1h30m"


def test_a_bad_drain_annotation_is_reported_and_changes_nothing() -> None:
    records = dict([existing("gpu-0", "ECC")])
    slice_ = make_slice({mark("gpu-0"): "ECC", DRAIN_ANNOTATION_PREFIX + "gpu-0": "Soon",
                         mark("gpu-1"): "hot", DRAIN_ANNOTATION_PREFIX + "gpu-1": "EvictAfter=2d"})
    sync = plan_slice(slice_, records)
    assert sync.create == () and sync.update_drain == () and sync.delete == ()
    assert [e.key for e in sync.errors] == [DRAIN_ANNOTATION_PREFIX + "gpu-0", DRAIN_ANNOTATION_PREFIX + "gpu-1"]
    assert "'Soon' is not a drain mode; use Immediate, AllowCompletion, Node or EvictAfter=<duration>" in \
        sync.errors[0].message


def test_a_changed_drain_annotation_updates_the_record() -> None:
    records = dict([existing("gpu-0", "ECC")])
    sync = plan_slice(make_slice({mark("gpu-0"): "ECC", DRAIN_ANNOTATION_PREFIX + "gpu-0": "AllowCompletion"}),
                      records)
    assert sync.update_drain == ((record_name(DeviceRef(DRIVER, POOL, "gpu-0")), "AllowCompletion"),)
