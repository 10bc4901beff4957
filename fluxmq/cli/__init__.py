"""``fluxmqctl``: the command-line client of a FluxMQ broker or cluster (issue 6).

It talks gRPC with the generated stubs only (``fluxmq._pb``); it imports nothing of the broker,
so it works against any FluxMQ node of a compatible API. ``main`` parses and dispatches,
``conn`` finds the broker and turns failures into one line, ``output`` prints tables and JSON;
one module per noun (queue, publish, consume/tail, group, offsets, dlq, cluster, key).
"""

import os

# gRPC's C core prints its own lines on stderr (a failed TLS handshake...): fluxmqctl says what
# went wrong in its one error line. Set before grpc loads; an explicit setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
