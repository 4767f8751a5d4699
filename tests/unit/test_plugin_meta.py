"""`kubectl claimwarden version` and `completion`: the pure parts, and bash running the generated script."""

from __future__ import annotations

import json
import subprocess

import pytest

from claimwarden import __version__
from claimwarden.plugin import cli, meta


def test_the_bash_script_names_every_subcommand_and_defines_its_function() -> None:
    script = meta.bash_completion(cli.parser())
    for verb in cli.VERBS:
        assert f"        {verb})\n" in script, verb
    check = "\ndeclare -F _kubectl_claimwarden && complete -p kubectl-claimwarden"
    result = subprocess.run(["bash", "-c", script + check], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "complete -o default -F _kubectl_claimwarden kubectl-claimwarden" in result.stdout


def _complete(words: list[str]) -> list[str]:
    script = meta.bash_completion(cli.parser())
    quoted = " ".join(f"'{w}'" for w in words)
    run = (f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
           '_kubectl_claimwarden; echo "${COMPREPLY[@]}"')
    result = subprocess.run(["bash", "-c", run], capture_output=True, text=True, check=True)
    return result.stdout.split()


def test_bash_completes_verbs_flags_and_choices() -> None:
    assert _complete(["kubectl-claimwarden", "d"]) == ["doctor", "devices", "drain"]
    assert _complete(["kubectl-claimwarden", "mark", "gpu-0", "--effect", ""]) == ["NoExecute", "NoSchedule", "None"]
    assert _complete(["kubectl-claimwarden", "drain", "node-0", "--for"]) == ["--force-after", "--force"]
    assert "-A" not in _complete(["kubectl-claimwarden", "drain", "node-0", "-"])


def test_the_zsh_script_loads_bashcompinit_first() -> None:
    script = meta.zsh_completion(cli.parser())
    assert script.startswith("#compdef kubectl-claimwarden\nautoload -U +X bashcompinit && bashcompinit\n")
    assert script.endswith(meta.bash_completion(cli.parser()))


def test_completion_prints_the_script_without_a_cluster(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    assert cli.main(["completion", "bash"]) == cli.EXIT_OK
    assert capsys.readouterr().out == meta.bash_completion(cli.parser())


def test_version_without_a_cluster_prints_the_client_version_and_exits_0(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    assert cli.main(["version"]) == cli.EXIT_OK
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == f"Client Version: claimwarden {__version__}"
    assert "Server: not reached (cannot load the kubeconfig" in out.out
    assert out.err == ""
    assert cli.main(["version", "-o", "json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"clientVersion": {"claimwarden": __version__}}


def test_version_data_and_text_with_a_cluster() -> None:
    data = meta.version_data({"gitVersion": "v1.36.3", "platform": "linux/amd64", "goVersion": "go1.25"},
                             {"unhealthydevices": True, "healthpolicies": False})
    assert data == {"clientVersion": {"claimwarden": __version__},
                    "serverVersion": {"gitVersion": "v1.36.3", "platform": "linux/amd64"},
                    "crds": {"unhealthydevices": True, "healthpolicies": False}}
    assert meta.version_text(data, None).splitlines() == [
        f"Client Version: claimwarden {__version__}", "Server Version: v1.36.3",
        "CRDs: unhealthydevices.claimwarden.io installed, healthpolicies.claimwarden.io missing "
        "('kubectl apply -k crds/')"]


def test_version_client_reads_no_kubeconfig(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    assert cli.main(["version", "--client"]) == cli.EXIT_OK
    assert capsys.readouterr().out == f"Client Version: claimwarden {__version__}\n"


@pytest.mark.parametrize("argv", [
    ["explain", "pod/x", "-A"],  # explain reads one namespace
    ["doctor", "-o", "wide"],  # doctor prints the same text either way
    ["devices", "-n", "ns"], ["devices", "-A"],  # devices are cluster-wide
    ["mark", "p/d", "--reason", "r", "-n", "ns"], ["mark", "p/d", "--reason", "r", "-A"],
    ["clear", "p/d", "-n", "ns"], ["clear", "p/d", "-A"],
    ["approve", "p/d", "-n", "ns"], ["approve", "p/d", "-A"],
    ["uninstall", "--check", "-n", "ns"], ["uninstall", "--check", "-A"],
    ["drain", "node-0", "-n", "ns"], ["drain", "node-0", "-o", "json"],
])
def test_a_flag_the_verb_would_ignore_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err or "invalid choice" in err, err


@pytest.mark.parametrize("argv", [["devices", "-o", "name"], ["doctor", "-o", "name"], ["doctor", "-A", "-n", "x"],
                                  ["explain", "pod/x", "-n", "ns", "-o", "wide"]])
def test_the_flags_each_verb_reads_are_accepted(argv: list[str]) -> None:
    assert cli.parser().parse_args(argv).verb == argv[0]
