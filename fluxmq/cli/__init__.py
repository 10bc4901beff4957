"""``fluxmqctl``: the command-line client of a FluxMQ broker or cluster (issue 6).

It talks gRPC with the generated stubs only (``fluxmq._pb``); it imports nothing of the broker,
so it works against any FluxMQ node of a compatible API. ``main`` parses and dispatches,
``conn`` finds the broker and turns failures into one line, ``output`` prints tables and JSON;
one module per noun (queue, publish, consume/tail, group, offsets, dlq, cluster).
"""
