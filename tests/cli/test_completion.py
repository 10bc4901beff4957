"""``fluxmqctl completion bash|zsh|fish``: the scripts, sourced in the real shells, complete
commands, verbs, options and option choices (zsh and fish come from `make test`'s Debian
packages; without them these tests fail, saying so)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fluxmq.cli import completion
from fluxmq.cli.main import build_parser

from .conftest import Ctl

# (the words typed, the cursor's word last: "" = after a space) -> what completes
CASES = [
    (("qu",), {"queue"}),
    (("queue", "cr"), {"create"}),
    (("queue", "create", "orders", "--ty"), {"--type"}),
    (("queue", "create", "--type", ""), {"work", "stream"}),
    (("-o", "j"), {"json", "jsonl"}),
    (("queue", "list", "-o", ""), {"table", "json", "jsonl"}),
    (("node", "un"), {"undrain"}),
    (("group", "reset-offsets", "q", "g", "--dry"), {"--dry-run"}),
    (("completion", "z"), {"zsh"}),
]


def _shell(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed: `make test` installs the Debian package {name}"
    return path


def _bash_like(shell: str, script: Path, words: tuple[str, ...]) -> set[str]:
    quoted = " ".join("'" + w + "'" for w in ("fluxmqctl", *words))
    setup = "setopt shwordsplit ksharrays; " if shell.endswith("zsh") else ""
    program = (
        f"source {script}; {setup}COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; "
        '_fluxmqctl; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run([shell, "-c", program], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return {w for w in out.stdout.split("\n") if w}


def _fish(script: Path, words: tuple[str, ...]) -> set[str]:
    line = " ".join(("fluxmqctl", *words))
    program = f"source {script}; complete -C {line!r}"
    out = subprocess.run(
        [_shell("fish"), "-c", program], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return {w.split("\t")[0] for w in out.stdout.split("\n") if w}


@pytest.mark.parametrize("shell", completion.SHELLS)
def test_the_scripts_complete_commands_verbs_options_and_choices(
    shell: str, ctl: Ctl, tmp_path: Path
) -> None:
    script = tmp_path / f"fluxmqctl.{shell}"
    script.write_text(ctl.ok("completion", shell))  # needs no broker
    for words, expected in CASES:
        got = _fish(script, words) if shell == "fish" else _bash_like(_shell(shell), script, words)
        assert expected <= got and all(w.startswith(words[-1]) for w in got), (words, got)


def test_the_tree_holds_every_command_of_the_parser() -> None:
    root = completion.tree(build_parser())
    assert {"queue", "publish", "consume", "tail", "node", "shard", "completion"} <= set(root.verbs)
    assert root.verbs["tail"].options["--output"] == ("table", "json", "jsonl")
    assert root.verbs["completion"].arguments == completion.SHELLS
