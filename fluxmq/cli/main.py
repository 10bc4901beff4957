"""``fluxmqctl``: parsing, dispatch and exit codes. Every failure ends as one line on stderr and
an exit code (see EPILOG); ``FLUXMQCTL_DEBUG=1`` lets unexpected exceptions through with their
traceback."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from fluxmq.cli import (
    cluster,
    completion,
    consume,
    dlq,
    group,
    key,
    node,
    offsets,
    publish,
    queue,
)
from fluxmq.cli.conn import (
    API_KEY_ENV,
    DEFAULT_PROFILE,
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT_S,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    INTERRUPT,
    PROFILE_ENV,
    CliError,
    Connection,
    Context,
    load_profile,
    resolve_security,
    resolve_servers,
)
from fluxmq.cli.output import FORMATS, Printer
from fluxmq.cli.values import positive_float

DEBUG_ENV = "FLUXMQCTL_DEBUG"

EPILOG = f"""\
server address: --server, else $FLUXMQ_ADDR, else "server" in the profile file
(${PROFILE_ENV}, default {DEFAULT_PROFILE}; TOML keys: server, timeout,
output, tls_ca, tls_cert, tls_key), else {DEFAULT_SERVER}. Several addresses (a:7070,b:7070):
the first that accepts a connection is used.

security: --api-key, else ${API_KEY_ENV} (prefer the variable: a flag shows in `ps`), goes
with every call as "authorization: Bearer <key>" and is never printed. --tls-ca FILE (PEM CA
bundle) or --tls (the system's roots) makes every connection TLS; --tls-cert + --tls-key add a
client certificate (mutual TLS). Rate-limited calls are repeated after the broker's advised delay.

output: human tables by default; -o json prints one JSON document per command (the protobuf
JSON mapping with proto field names: 64-bit integers are strings, bytes are base64); -o jsonl
prints that document on one line, and tail and consume one object per record as it arrives
(text where the bytes are UTF-8, base64 where not, flagged). tail and consume also take kcat
--format strings (%s value, %k key, %p partition, %o offset, %T timestamp, %h headers, ...).

exit codes:
  0    ok
  1    the broker refused the request: "error: REASON: message (request id X)" on stderr
  2    bad usage (unknown flag, bad value, a destructive command without --yes off a terminal)
  3    the broker could not be reached or did not answer in time (UNAVAILABLE, DEADLINE_EXCEEDED)
  130  interrupted (Ctrl-C)
Errors are one line, never a traceback; {DEBUG_ENV}=1 shows the traceback of an unexpected one.
"""


class _Subcommands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Parses a command's own arguments intermixed: options and positionals in any order
    (``publish Q --key k hello``), which plain argparse refuses once a ``nargs="*"`` positional
    has matched nothing. A noun whose verbs are subcommands again parses as usual (argparse
    cannot intermix a parser with subparsers); its verb then intermixes."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        name, arg_strings = values[0], values[1:]
        if self.dest is not argparse.SUPPRESS:
            setattr(namespace, self.dest, name)
        chosen = self._name_parser_map.get(name)
        if chosen is None:
            choices = ", ".join(self._name_parser_map)
            raise argparse.ArgumentError(self, f"unknown command {name!r} (choices: {choices})")
        if chosen._subparsers is None:
            sub_ns, extras = chosen.parse_known_intermixed_args(arg_strings, None)
        else:
            sub_ns, extras = chosen.parse_known_args(arg_strings, None)
        for dest, value in vars(sub_ns).items():
            setattr(namespace, dest, value)
        if extras:
            vars(namespace).setdefault(argparse._UNRECOGNIZED_ARGS_ATTR, []).extend(extras)


class CliParser(argparse.ArgumentParser):
    """Every parser of fluxmqctl: its subcommands (and theirs) use ``_Subcommands``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)


def version() -> str:
    try:
        return metadata.version("fluxmq")
    except metadata.PackageNotFoundError:  # running from a tree that was never installed
        return "unknown (not installed)"


def _common() -> argparse.ArgumentParser:
    """Global options, accepted before or after the command (defaults applied after parsing)."""
    common = CliParser(add_help=False)
    g = common.add_argument_group("global options")
    g.add_argument(
        "--server",
        "-s",
        metavar="HOST:PORT",
        default=argparse.SUPPRESS,
        help="broker address(es), comma-separated "
        f"(default $FLUXMQ_ADDR, the profile, {DEFAULT_SERVER})",
    )
    g.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=argparse.SUPPRESS,
        help="output format (default table)",
    )
    g.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        default=argparse.SUPPRESS,
        help=f"deadline of each call, s (default {DEFAULT_TIMEOUT_S:g}; long polls add their wait)",
    )
    g.add_argument(
        "--api-key",
        metavar="KEY",
        default=argparse.SUPPRESS,
        help=f"API key sent with every call (default ${API_KEY_ENV}; never printed)",
    )
    g.add_argument(
        "--tls",
        action="store_true",
        default=argparse.SUPPRESS,
        help="TLS with the system's root certificates (implied by --tls-ca / --tls-cert)",
    )
    g.add_argument(
        "--tls-ca",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="PEM CA bundle that signs the broker's certificate: connect with TLS",
    )
    g.add_argument(
        "--tls-cert", metavar="FILE", default=argparse.SUPPRESS, help="client certificate (mTLS)"
    )
    g.add_argument(
        "--tls-key", metavar="FILE", default=argparse.SUPPRESS, help="its private key (mTLS)"
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = CliParser(
        prog="fluxmqctl",
        description="Administer and use a FluxMQ broker or cluster over its gRPC API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"fluxmqctl {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    queue.register(sub, common)
    publish.register(sub, common)
    consume.register(sub, common)
    group.register(sub, common)
    offsets.register(sub, common)
    dlq.register(sub, common)
    cluster.register(sub, common)
    key.register(sub, common)
    node.register(sub, common)
    completion.register(sub, common)
    return parser


def _context(args: argparse.Namespace) -> Context:
    env = dict(os.environ)
    profile = load_profile(env)
    servers = resolve_servers(getattr(args, "server", None), env, profile)
    timeout = getattr(args, "timeout", None) or profile.timeout or DEFAULT_TIMEOUT_S
    fmt = getattr(args, "output", None) or profile.output or "table"
    security = resolve_security(
        api_key=getattr(args, "api_key", None),
        tls=getattr(args, "tls", False),
        tls_ca=getattr(args, "tls_ca", None),
        tls_cert=getattr(args, "tls_cert", None),
        tls_key=getattr(args, "tls_key", None),
        env=env,
        profile=profile,
    )
    return Context(Connection(servers, timeout, security), Printer(fmt), servers, timeout, security)


def run(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # SystemExit(2) on bad usage
    if getattr(args, "completion", False):  # needs no broker, no profile
        sys.stdout.write(completion.script(args.shell, parser))
        return 0
    ctx = _context(args)
    try:
        return int(args.handler(args, ctx))
    finally:
        ctx.close()


def main(argv: Sequence[str] | None = None) -> int:
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    signal.signal(signal.SIGINT, INTERRUPT.handle)
    try:
        return run(argv)
    except CliError as err:
        _stderr(err.line)
        return err.exit_code
    except KeyboardInterrupt:
        _stderr("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, without a flush error at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as err:
        if debug:
            raise
        detail = " ".join(str(err).split())
        _stderr(f"error: {type(err).__name__}: {detail} (a bug? {DEBUG_ENV}=1 shows the traceback)")
        return EXIT_REFUSED


def _stderr(line: str) -> None:
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
