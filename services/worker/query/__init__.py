"""The query endpoint of a worker (docs/formats.md, "Query API").

- :mod:`.service`: what the worker wires (``attach``), the parts' lifecycle;
- :mod:`.views`: committed snapshots of the owned partitions and their positions;
- :mod:`.positions`: the state-topic position of each commit;
- :mod:`.members`: owners (the consumer group) and query addresses (the members topic);
- :mod:`.answers`, :mod:`.reads`: what a request is answered; :mod:`.server`: HTTP;
- :mod:`.standby`: standby replicas (warm copies of other workers' partitions).
"""
