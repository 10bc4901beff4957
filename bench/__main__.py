"""``python -m bench``: FluxMQ against RabbitMQ and NATS (bench/compare.py);
``python -m bench flux ...``: FluxMQ's own detailed suite (bench/flux_suite.py)."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "flux":
    from bench.flux_suite import main as flux_main

    sys.argv = [sys.argv[0], *sys.argv[2:]]
    raise SystemExit(flux_main())

from bench.compare import main

raise SystemExit(main())
