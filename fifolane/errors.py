"""fifolane's exceptions: one root, one-line leaves.

    FifolaneError
    ├── ConfigError            bad settings (unknown key, wrong type)
    ├── SchemaError            bad .avsc declaration (group/key/version attributes)
    │   └── UnknownSchemaError no writer schema for a fingerprint / id
    ├── SerializationError     a value does not fit its schema / undecodable bytes
    │   └── SchemaRegistryError the Schema Registry failed or refused (often transient)
    ├── ValidationError        a JSON event line that does not validate
    ├── TopicConfigError       an existing topic has a config fifolane cannot work with
    ├── ClusterError           the local Apache Kafka could not start / stop
    ├── ExpressionError        an invalid CEL filter/converter (with position)
    └── ListenerError          a listener registration problem (name clash, unknown name)

Library errors are wrapped and chained (``raise X(...) from exc``) at the boundary.
"""

from __future__ import annotations

__all__ = [
    "ClusterError",
    "ConfigError",
    "ExpressionError",
    "FifolaneError",
    "ListenerError",
    "SchemaError",
    "SchemaRegistryError",
    "SerializationError",
    "TopicConfigError",
    "UnknownSchemaError",
    "ValidationError",
]


class FifolaneError(Exception):
    """Root of every error fifolane raises on purpose."""


class ConfigError(FifolaneError):
    """Settings could not be loaded: unknown key, wrong type or missing value."""


class SchemaError(FifolaneError):
    """An Avro schema declaration is invalid for fifolane (says which schema and the fix)."""


class UnknownSchemaError(SchemaError):
    """No writer schema is known for a fingerprint or registry id."""


class SerializationError(FifolaneError):
    """A value could not be encoded, or bytes could not be decoded."""


class SchemaRegistryError(SerializationError):
    """The Schema Registry could not be reached or refused a request (often transient)."""


class ValidationError(FifolaneError):
    """An input event does not validate against its schema."""


class TopicConfigError(FifolaneError):
    """An existing topic's configuration conflicts with its fifolane role."""


class ClusterError(FifolaneError):
    """The local Apache Kafka cluster could not be started, reached or stopped."""


class ExpressionError(FifolaneError):
    """A CEL expression is invalid; ``position`` is the 0-based offset of the error, if known."""

    def __init__(self, message: str, *, expression: str = "", position: int | None = None) -> None:
        super().__init__(message)
        self.expression = expression
        self.position = position


class ListenerError(FifolaneError):
    """A listener registration was refused (name clash, unknown listener, bad option)."""
