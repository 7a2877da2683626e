"""fifolane's Spark views: batch reads of the compacted state topic, views as Parquet.

Modules (import them directly; this package imports nothing so that ``import spark.wire``
stays cheap):

- :mod:`spark.session`   ``get_session(master, app_name)``: the one SparkSession factory
- :mod:`spark.packages`  which Maven artifacts provide the Kafka source and ``from_avro``
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
