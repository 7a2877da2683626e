"""fifolane's Spark views: batch reads of the compacted state topic, views as Parquet.

Modules (import them directly; this package imports nothing so that ``import spark.wire``
stays cheap):

- :mod:`spark.session`   ``get_session(master, app_name)``: the one SparkSession factory
                         (JVM output to ``<home>/spark/logs``)
- :mod:`spark.packages`  the pinned Spark version, its connector artifacts, the start-up check
- :mod:`spark.progress`  live stages and tasks of a build (rich, from the StatusTracker)
- :mod:`spark.read`      ``read_topic``, ``latest_per_key``, ``read_state``
- :mod:`spark.wire`      the value header (single-object / Confluent) with built-in functions
- :mod:`spark.decode`    ``resolve_writers``, ``decode_entities`` (per writer schema)
- :mod:`spark.views`     ``build_*`` functions (plain DataFrame -> DataFrame)
- :mod:`spark.history`   ``--as-of``: offsets by timestamp and the history window
- :mod:`spark.job`       ``build_views``: the whole job; ``compute_views``
- :mod:`spark.output`    Parquet layout and the build manifest
- :mod:`spark.summary`   rich tables for the CLI
- :mod:`spark.listeners` a listener output topic as the latest projection per key
"""

__all__: list[str] = []
