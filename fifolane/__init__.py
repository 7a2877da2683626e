"""fifolane: a Kafka-backed FIFO-group event pipeline with cluster listeners.

The shared core lives here: settings, errors, Avro serialization, topic roles and the
local Apache Kafka launcher. Runtime parts live in their own top-level packages:
``services`` (workers), ``listeners`` (registry, expressions, client), ``spark`` (views).
"""

from fifolane.config import Settings, load_settings
from fifolane.errors import FifolaneError

__all__ = ["FifolaneError", "Settings", "load_settings"]
__version__ = "0.2.0"
