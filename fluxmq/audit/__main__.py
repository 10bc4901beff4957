"""``python -m fluxmq.audit`` and ``spark-submit .../fluxmq/audit/__main__.py``."""

from fluxmq.audit.cli import main

raise SystemExit(main())
