"""The PySpark audit of FluxMQ partition logs (installed with the ``audit`` extra).

``source`` is the Spark data source (``spark.read.format("fluxmq")``) over node data
directories, ``tables`` the three tables it reads, ``rules`` the named integrity checks,
``job`` the audit and export jobs, ``report`` the report directory and ``cli`` the
``fluxmq-audit`` command. The broker never imports this package.
"""
