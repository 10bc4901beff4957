"""How ``fluxmqctl`` reads a command line: options and positionals in any order in every
command, piped lines as messages (as ``kcat -P``), ``--version``."""

from __future__ import annotations

import argparse
import os
import pty
import subprocess
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from fluxmq.cli.main import build_parser

from .conftest import CLI_TIMEOUT_S, Ctl
from .test_queues import table


def test_options_and_positionals_mix_in_every_command(ctl: Ctl) -> None:
    # An option between the noun's positionals, or before them, is where users put it.
    ctl.ok("queue", "create", "--partitions", "2", "mixed")
    assert ctl.json("queue", "describe", "-o", "json", "mixed")["config"]["partitions"] == 2
    rows = table(ctl.ok("publish", "mixed", "--key", "k", "hello", "--header", "h=v", "world"))
    assert len(rows) == 2 and rows[0]["PARTITION"] == rows[1]["PARTITION"]
    keyed = rows[0]["PARTITION"]
    doc = ctl.json("publish", "--partition", keyed, "mixed", "third")
    assert doc["results"][0]["partition"] == int(keyed)
    tailed = ctl.json("tail", "--from", "earliest", "mixed", "--partition", keyed, "--count", "3")
    assert [r["offset"] for r in tailed["records"]] == ["0", "1", "2"]
    ctl.ok("group", "create", "--start", "earliest", "mixed", "readers")
    assert ctl.json("group", "describe", "mixed", "-o", "json", "readers")["group"]["name"] == (
        "readers"
    )
    ctl.ok("queue", "delete", "--yes", "mixed")


def test_piped_lines_publish_one_message_each(ctl: Ctl) -> None:
    ctl.ok("queue", "create", "piped")
    proc = ctl.run("publish", "piped", "--partition", "0", input="a\nb\nc d\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("published 3 messages to piped"), proc.stdout
    tailed = ctl.json("tail", "piped", "--from", "earliest", "--count", "3")
    values = [r["value"] for r in tailed["records"]]
    assert values == ["YQ==", "Yg==", "YyBk"]  # a, b, "c d": one message per line, as sent
    # Empty piped input publishes nothing and is not an error (a filter that matched nothing).
    assert ctl.json("publish", "piped", input="")["published"] == 0


def test_publish_without_values_on_a_terminal_is_a_usage_error(ctl: Ctl) -> None:
    """On a terminal, no VALUE is a mistake, not an invitation to type messages."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run(
            [ctl.exe, "publish", "nothing"],
            stdin=terminal,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            env=ctl.env(),
        )
    finally:
        os.close(terminal)
        os.close(controller)
    assert proc.returncode == 2, proc.stderr
    assert "nothing to publish" in proc.stderr and "Traceback" not in proc.stderr


def test_version_is_the_package_version(ctl: Ctl) -> None:
    out = ctl.ok("--version")
    assert out.strip() == f"fluxmqctl {metadata.version('fluxmq')}"


def test_create_with_exist_ok_shows_the_existing_queue_and_group(ctl: Ctl) -> None:
    ctl.ok("queue", "create", "again", "--partitions", "2")
    assert "QUEUE_EXISTS" in ctl.fails(1, "queue", "create", "again")
    shown = ctl.json("queue", "create", "again", "--partitions", "5", "--exist-ok")
    assert shown["config"]["partitions"] == 2  # the queue as it is, not as asked
    ctl.ok("group", "create", "again", "readers", "--exist-ok")
    assert "GROUP_EXISTS" in ctl.fails(1, "group", "create", "again", "readers")
    assert ctl.json("group", "create", "again", "readers", "--exist-ok")["name"] == "readers"


# A valid value for each option some command requires (the walk below fails on a new one).
REQUIRED_VALUES = {
    "--group": "g",
    "--to": "earliest",  # also `shard move --to NODE`: any word parses
    "--from": "node1",
    "--partition": "0",
    "--offset": "1",
    "--scope": "ready",
    "--set": "max_attempts=5",
    "--name": "billing",
    "--role": "admin",
    "--id": "3",
}


def leaf_commands() -> list[tuple[list[str], argparse.ArgumentParser]]:
    """Every runnable command of fluxmqctl: (its words, its parser)."""

    def walk(words: list[str], parser: argparse.ArgumentParser) -> Iterator[Any]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield words, parser
            return
        for name, child in subs[0].choices.items():
            yield from walk([*words, name], child)

    return list(walk([], build_parser()))


def test_every_command_takes_options_before_between_and_after_its_arguments() -> None:
    leaves = leaf_commands()
    assert len(leaves) >= 20
    for words, parser in leaves:
        flags = {f for a in parser._actions for f in a.option_strings}
        options = ["-o", "json"] if "-o" in flags else []  # `key generate` runs offline
        for action in parser._actions:
            if action.required and action.option_strings:
                flag = action.option_strings[0]
                options += [flag, REQUIRED_VALUES[flag]]
        for group in parser._mutually_exclusive_groups:
            if group.required:
                flag = group._group_actions[0].option_strings[0]
                options += [flag, REQUIRED_VALUES[flag]]
        positionals = [
            str(next(iter(a.choices))) if a.choices else f"arg{n}"
            for n, a in enumerate(parser._actions)
            if not a.option_strings
        ]
        orders = [options + positionals, positionals + options]
        if positionals:
            orders.append(positionals[:1] + options + positionals[1:])
        parsed = [vars(build_parser().parse_args([*words, *argv])) for argv in orders]
        assert all(p == parsed[0] for p in parsed), (words, orders, parsed)
