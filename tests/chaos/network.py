"""Network partitions between node processes on one machine, with iptables.

Each node runs under a group id of its own (``setpriv --regid``, an exec wrapper: no
``preexec_fn`` from a process whose gRPC threads run) and listens on an address of its own
(127.0.0.11-13). A connection is marked (CONNMARK) with the group of the process that opened it;
a cut between nodes A and B drops every packet of the connections A opened to B's address and B
opened to A's, both directions (the conntrack original destination matches the replies too), so
an established connection stalls like one across a broken link.

Every rule lives in a chain of this test run's own, hooked into OUTPUT (loopback traffic passes
OUTPUT in both directions) and removed by ``close()`` however the test ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

GID_BASE = 40_010


class NetworkUnavailable(RuntimeError):
    """iptables cannot be used here: partition schedules fail with this reason."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # "n0"
    host: str  # "127.0.0.11"
    gid: int  # the group the node's process runs under
    mark: int  # the connmark of connections it opens


def endpoints(count: int) -> list[Endpoint]:
    return [Endpoint(f"n{i}", f"127.0.0.{11 + i}", GID_BASE + 1 + i, 1 + i) for i in range(count)]


def exec_prefix(endpoint: Endpoint) -> list[str]:
    """The command prefix that runs a program under the endpoint's group id."""
    return ["setpriv", f"--regid={endpoint.gid}", "--clear-groups", "--"]


def iptables_problem() -> str:
    """Why iptables cannot be used here ("" when it can)."""
    if shutil.which("iptables") is None:
        return "iptables is not installed (make test installs the Debian package iptables)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if os.geteuid() != 0:
        return "iptables needs root"
    probe = subprocess.run(["iptables", "-S", "OUTPUT"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"iptables cannot read OUTPUT: {probe.stderr.strip()[:200]}"
    return ""


class Partitions:
    """The cuts of one schedule, in chain ``FMQCHAOS<pid>``."""

    def __init__(self, nodes: Sequence[Endpoint]) -> None:
        problem = iptables_problem()
        if problem:
            raise NetworkUnavailable(problem)
        self.nodes = list(nodes)
        self.chain = f"FMQCHAOS{os.getpid()}"
        self._cuts: list[list[str]] = []
        try:
            self._run("-N", self.chain, check=False)
            self._run("-F", self.chain)
            self._run("-I", "OUTPUT", "-j", self.chain)
            for node in self.nodes:
                self._run(
                    "-A", self.chain, "-m", "owner", "--gid-owner", str(node.gid),
                    "-m", "conntrack", "--ctstate", "NEW",
                    "-j", "CONNMARK", "--set-mark", str(node.mark),
                )  # fmt: skip
        except BaseException:
            self.close()  # nothing of a half-made chain stays behind
            raise

    def _run(self, *args: str, check: bool = True) -> None:
        done = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)
        if check and done.returncode != 0:
            raise NetworkUnavailable(f"iptables {' '.join(args)}: {done.stderr.strip()[:300]}")

    def _drop(self, rule: list[str]) -> None:
        self._run("-A", self.chain, *rule, "-j", "DROP")
        self._cuts.append(rule)

    def cut(self, a: Endpoint, b: Endpoint) -> None:
        """Drop every packet between ``a`` and ``b`` (both directions, both openers)."""
        for src, dst in ((a, b), (b, a)):
            self._drop(
                ["-m", "connmark", "--mark", str(src.mark),
                 "-m", "conntrack", "--ctorigdst", dst.host]
            )  # fmt: skip

    def cut_port(self, a: Endpoint, host: str, port: int) -> None:
        """Drop ``a``'s connections to ``host:port`` (etcd)."""
        self._drop(
            ["-p", "tcp", "-m", "connmark", "--mark", str(a.mark),
             "-m", "conntrack", "--ctorigdst", host, "--ctorigdstport", str(port)]
        )  # fmt: skip

    def isolate(self, node: Endpoint) -> None:
        for other in self.nodes:
            if other != node:
                self.cut(node, other)

    def heal(self) -> None:
        for rule in self._cuts:
            self._run("-D", self.chain, *rule, "-j", "DROP", check=False)
        self._cuts.clear()

    def close(self) -> None:
        self.heal()
        self._run("-D", "OUTPUT", "-j", self.chain, check=False)
        self._run("-F", self.chain, check=False)
        self._run("-X", self.chain, check=False)


def leftover_chains() -> list[str]:
    """Chains of chaos runs still in the table (a test asserts there are none of its own)."""
    listed = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
    return sorted(
        {line.split()[1] for line in listed.splitlines() if line.startswith("-N FMQCHAOS")}
    )
