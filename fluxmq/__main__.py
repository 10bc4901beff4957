import os

# A node starts its shard processes by fork and exec (libuv's spawn, under uvloop). gRPC's fork
# handlers have nothing to do for a child that execs at once, and would log a line on every
# start about skipping them because other threads are in gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from fluxmq.daemon import main

raise SystemExit(main())
