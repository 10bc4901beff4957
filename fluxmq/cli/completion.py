"""``fluxmqctl completion bash|zsh|fish``: a shell completion script, made from the parser
itself, so every command, verb, option and option choice the CLI has is completed, and one
added later is too.

    eval "$(fluxmqctl completion bash)"          # ~/.bashrc
    eval "$(fluxmqctl completion zsh)"           # ~/.zshrc (through zsh's bashcompinit)
    fluxmqctl completion fish | source           # ~/.config/fish/config.fish

The scripts hold the command tree as data (``tree``): nouns, their verbs, and per command the
options with their choices. Completion never calls the broker.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from typing import Any

SHELLS = ("bash", "zsh", "fish")


@dataclass
class Command:
    """One completable command: ``queue create``, or ``tail`` (no verb)."""

    options: dict[str, tuple[str, ...]] = field(default_factory=dict)  # flag -> its choices
    verbs: dict[str, Command] = field(default_factory=dict)
    arguments: tuple[str, ...] = ()  # the choices of its positional arguments


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        choices = tuple(str(c) for c in action.choices) if action.choices else ()
        for flag in action.option_strings:
            out[flag] = choices
    return out


def tree(parser: argparse.ArgumentParser) -> Command:
    """The command tree of ``parser``.

    >>> p = argparse.ArgumentParser(prog="x")
    >>> sub = p.add_subparsers()
    >>> q = sub.add_parser("queue").add_subparsers()
    >>> _ = q.add_parser("create").add_argument("--type", choices=["work", "stream"])
    >>> tree(p).verbs["queue"].verbs["create"].options["--type"]
    ('work', 'stream')
    """
    arguments = tuple(
        str(c)
        for a in parser._actions
        if not a.option_strings and a.choices and not isinstance(a, argparse._SubParsersAction)
        for c in a.choices
    )
    cmd = Command(options=_options(parser), arguments=arguments)
    for name, child in _subparsers(parser).items():
        cmd.verbs[name] = tree(child)
    return cmd


def _bash_table(root: Command) -> list[str]:
    """Lines of bash associative arrays: words per path (``queue`` -> its verbs, ``queue
    create`` -> its options) and choices per path and option."""
    lines = []
    words: dict[str, list[str]] = {}
    choices: dict[str, tuple[str, ...]] = {}

    def walk(cmd: Command, path: str) -> None:
        words[path] = [
            *cmd.verbs,
            *cmd.arguments,
            *(f for f in cmd.options if f.startswith("--")),
        ]
        for flag, values in cmd.options.items():
            if values:
                choices[f"{path or '.'}|{flag}"] = values
        for name, child in cmd.verbs.items():
            walk(child, f"{path} {name}".strip())

    walk(root, "")
    for path, ws in sorted(words.items()):
        lines.append(f"  [{shlex.quote(path or '.')}]={shlex.quote(' '.join(ws))}")
    out = ["  local -A words=(", *lines, "  )", "  local -A choices=("]
    for key, values in sorted(choices.items()):
        out.append(f"    [{shlex.quote(key)}]={shlex.quote(' '.join(values))}")
    out.append("  )")
    return out


def bash(root: Command) -> str:
    return "\n".join(
        [
            "# fluxmqctl completion for bash (fluxmqctl completion bash)",
            "_fluxmqctl_filter() {",
            "  # The words of $1 that start with $2 (not compgen: zsh's bashcompinit one does",
            "  # not filter after --, and a word may start with -).",
            "  local w",
            "  COMPREPLY=()",
            '  for w in $1; do case "$w" in "$2"*) COMPREPLY+=("$w") ;; esac; done',
            "}",
            "_fluxmqctl() {",
            '  [ -n "${ZSH_VERSION:-}" ] && setopt localoptions shwordsplit ksharrays',
            *_bash_table(root),
            '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="" path="" i w key',
            '  [ "$COMP_CWORD" -gt 0 ] && prev="${COMP_WORDS[COMP_CWORD-1]}"',
            "  # The command path: the words that name a noun or verb, up to the cursor.",
            "  for ((i = 1; i < COMP_CWORD; i++)); do",
            '    w="${COMP_WORDS[i]}"',
            '    key="${path:-.}"',
            '    case " ${words[$key]} " in',
            '      *" $w "*) [ "${w#-}" = "$w" ] && path="${path:+$path }$w" ;;',
            "    esac",
            "  done",
            '  key="${path:-.}"',
            "  # After an option with choices: its choices (a global option's at any depth).",
            '  if [ -n "${choices[$key|$prev]+x}" ]; then',
            '    _fluxmqctl_filter "${choices[$key|$prev]}" "$cur"; return',
            "  fi",
            '  if [ -n "${choices[.|$prev]+x}" ]; then',
            '    _fluxmqctl_filter "${choices[.|$prev]}" "$cur"; return',
            "  fi",
            '  _fluxmqctl_filter "${words[$key]}" "$cur"',
            "}",
            "complete -o default -F _fluxmqctl fluxmqctl",
            "",
        ]
    )


def zsh(root: Command) -> str:
    return "\n".join(
        [
            "# fluxmqctl completion for zsh (fluxmqctl completion zsh): the bash function",
            "# through zsh's bashcompinit.",
            "autoload -U +X compinit && compinit",
            "autoload -U +X bashcompinit && bashcompinit",
            bash(root).split("\n", 1)[1],
        ]
    )


def fish(root: Command) -> str:
    lines = ["# fluxmqctl completion for fish (fluxmqctl completion fish | source)"]
    lines.append("complete -c fluxmqctl -f")
    nouns = " ".join(root.verbs)
    lines.append(f"complete -c fluxmqctl -n __fish_use_subcommand -a {shlex.quote(nouns)}")

    def flag_line(condition: str, flag: str, values: tuple[str, ...]) -> str:
        name = f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"
        line = f"complete -c fluxmqctl -n {shlex.quote(condition)} {name}"
        if values:
            line += f" -r -f -a {shlex.quote(' '.join(values))}"
        return line

    for flag, values in root.options.items():
        lines.append(flag_line("true", flag, values))
    for noun, cmd in root.verbs.items():
        seen = f"__fish_seen_subcommand_from {noun}"
        if cmd.verbs:
            verbs = " ".join(cmd.verbs)
            condition = f"{seen}; and not __fish_seen_subcommand_from {verbs}"
            lines.append(
                f"complete -c fluxmqctl -n {shlex.quote(condition)} -a {shlex.quote(verbs)}"
            )
            for verb, child in cmd.verbs.items():
                condition = f"{seen}; and __fish_seen_subcommand_from {verb}"
                for flag, values in child.options.items():
                    if flag not in root.options:
                        lines.append(flag_line(condition, flag, values))
        for flag, values in cmd.options.items():
            if flag not in root.options:
                lines.append(flag_line(seen, flag, values))
        if cmd.arguments:
            shown = shlex.quote(" ".join(cmd.arguments))
            lines.append(f"complete -c fluxmqctl -n {shlex.quote(seen)} -a {shown}")
    return "\n".join(lines) + "\n"


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    root = tree(parser)
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](root)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish)",
        description='bash: eval "$(fluxmqctl completion bash)" in ~/.bashrc; zsh: eval '
        '"$(fluxmqctl completion zsh)" in ~/.zshrc; fish: fluxmqctl completion fish | source '
        "in ~/.config/fish/config.fish. Completes commands, verbs, options and their choices; "
        "never calls the broker.",
    )
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(handler=None, completion=True)
