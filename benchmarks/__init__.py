"""fifolane benchmarks: ``python -m benchmarks run [--quick] [--only NAME,...]``.

Every suite runs against one Kafka broker and reports ratios to baselines measured in the
same run. Results go to ``benchmarks/results/`` (JSON per suite, PNG plots, ``latest.md``).
"""
