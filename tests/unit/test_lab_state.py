"""The lab's start-up guards: bad options, missing binaries, stale and foreign directories."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from claimwarden_lab import binaries, cluster, guests
from claimwarden_lab.processes import LabError, Process, is_running, start, start_time


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(("field", "value", "message"), [
    ("nodes", 0, "--nodes 0 is out of range"),
    ("gpus_per_node", 129, "--gpus-per-node 129 is out of range"),
    ("api_port", 80, "--api-port 80 is out of range"),
    ("models", "B200", "unknown GPU model"),
    ("kcm_qps", -1, "--kcm-qps -1 is negative"),
    ("kubernetes", "1.33", "not one the lab runs"),
])
def test_bad_options_are_rejected(field: str, value: object, message: str) -> None:
    options = cluster.LabOptions(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(LabError, match=message):
        options.validate()


def test_missing_binaries_name_make_bins(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="run 'make bins'"):
        binaries.require_binaries(tmp_path)


def test_missing_go_toolchain_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LabError, match="no Go toolchain"):
        binaries.require_binaries(tmp_path)


def test_bin_dir_is_versioned_and_overridable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLAIMWARDEN_BIN_DIR", raising=False)
    assert binaries.bin_dir().parts[-3:] == ("claimwarden", "bin", "v1.34.4")
    monkeypatch.setenv("CLAIMWARDEN_BIN_DIR", "/opt/bins")
    assert binaries.bin_dir() == Path("/opt/bins")
    assert binaries.bin_dir("1.37.2").parts[-1] == "v1.37.2", "the override is the default version's only"


@pytest.mark.parametrize(("given", "resolved"), [("1.34", "1.34.4"), ("v1.37", "1.37.2"), ("1.36.3", "1.36.3")])
def test_kubernetes_versions_resolve_to_the_served_patch_release(given: str, resolved: str) -> None:
    assert binaries.resolve_version(given) == resolved


@pytest.mark.parametrize("given", ["1.33", "1.37.1", "2.0", "latest", ""])
def test_other_kubernetes_versions_are_refused_with_the_list(given: str) -> None:
    with pytest.raises(LabError, match=r"1\.34, 1\.35, 1\.36, 1\.37"):
        binaries.resolve_version(given)


def test_missing_binaries_of_another_version_name_its_build(tmp_path: Path) -> None:
    with pytest.raises(LabError, match=r"make bins K8S_VERSION=1\.37\.2"):
        binaries.require_binaries(tmp_path, version="1.37.2")


def test_foreign_directory_is_never_wiped(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(LabError, match="holds no claimwarden lab"):
        cluster._prepare_dir(tmp_path, print)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_stale_lab_is_cleared(tmp_path: Path) -> None:
    directory = tmp_path / "lab"
    directory.mkdir()
    state = cluster.LabState(dir=directory, processes=[Process("etcd", _dead_pid(), "/bin/etcd", "x.log")],
                             ready=True)
    state.save()
    said: list[str] = []
    assert cluster._prepare_dir(directory, said.append) is None
    assert not directory.exists()
    assert "stale lab" in said[0]


def test_half_running_lab_is_refused(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        state = cluster.LabState(dir=tmp_path, processes=[
            Process("etcd", sleeper.pid, "sleep", "x.log"), Process("kwok", _dead_pid(), "/bin/kwok", "y.log")],
            ready=True)
        state.save()
        assert is_running(state.processes[0])
        with pytest.raises(LabError, match=r"half running .*kwok.*lab down"):
            cluster._prepare_dir(tmp_path, print)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_pid_running_another_binary_is_not_ours() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert not is_running(Process("etcd", sleeper.pid, "/usr/bin/etcd", "x.log"))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_reused_pid_with_another_start_time_is_not_ours() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        started = start_time(sleeper.pid)
        assert started > 0
        assert is_running(Process("etcd", sleeper.pid, "/usr/bin/etcd", "x.log", started=started))
        assert not is_running(Process("etcd", sleeper.pid, "sleep", "x.log", started=started + 1))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_restart_repeats_the_recorded_command_line(tmp_path: Path) -> None:
    from claimwarden_lab.processes import restart, start, stop

    first = start("sleeper", ["sleep", "60"], tmp_path, env={"X": "1"})
    saved = Process.from_json(first.to_json())
    assert saved.argv == ["sleep", "60"] and saved.env == {"X": "1"}
    second = restart(saved)
    try:
        assert not is_running(first) and is_running(second)
        assert second.argv == first.argv and second.pid != first.pid and second.log == first.log
    finally:
        stop(second)
    with pytest.raises(LabError, match="did not record its command line"):
        restart(Process("old", second.pid, "sleep", "x.log"))


def test_down_also_stops_a_guest_left_running(tmp_path: Path) -> None:
    """A guest (the demo's claimwarden) whose starter was killed is stopped by `down`, by PID."""
    directory = tmp_path / "lab"
    (directory / "logs").mkdir(parents=True)
    cluster.LabState(dir=directory, ready=True).save()
    guest = start("guest", ["sleep", "60"], directory / "logs")
    guests.add_guest(directory, guest)
    assert [g.pid for g in guests.guests(directory)] == [guest.pid]
    assert any("(guest)" in line for line in cluster.status(directory))
    cluster.down(directory, say=lambda _: None)
    assert not is_running(guest) and not directory.exists()


def test_a_half_written_guest_record_is_dropped(tmp_path: Path) -> None:
    (tmp_path / guests.GUESTS_DIR).mkdir()
    (tmp_path / guests.GUESTS_DIR / "x.json").write_text("{")
    assert guests.guests(tmp_path) == [] and guests.stop_guests(tmp_path) == []
