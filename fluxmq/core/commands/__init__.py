"""The commands of the queue state machine: their codec, and each command's rules.

``codec`` is the wire form (op code + protobuf); it is all this ``__init__`` imports, so that
``from fluxmq.core.commands import Op, decode, encode`` costs nothing more. The rest is one
module per command family, each holding the apply side of its commands (``apply_<op>``: the
state machine's handlers) and, for the consumer-group commands, the leader side too
(``prepare_<op>``: a request turned into its command). Both sides call the same checks
(``rules``), so a rule is written once and refuses alike wherever it runs:

- ``results``: what the handlers return;
- ``context``: ``ApplyContext``, what a handler may touch while a batch's transaction is open;
- ``rules``: the consumer-group checks shared by prepare and apply;
- ``queues``, ``append``, ``leases``, ``members``, ``letters``, ``retention``, ``transact``.

No family module imports this ``__init__`` (each imports ``codec`` or its siblings directly).
"""

from __future__ import annotations

from fluxmq.core.commands.codec import Command, Op, UnknownCommandError, decode, encode

__all__ = ["Command", "Op", "UnknownCommandError", "decode", "encode"]
