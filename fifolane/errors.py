"""fifolane's exceptions: one root, one-line leaves.

    FifolaneError
    ├── ConfigError            bad settings (unknown key, wrong type)
    │   └── LoginRefusedError  Kafka refused the login or the TLS handshake (never retried)
    ├── SchemaError            bad .avsc declaration (group/key/version attributes)
    │   └── UnknownSchemaError no writer schema for a fingerprint / id
    ├── SerializationError     a value does not fit its schema / undecodable bytes
    │   └── SchemaRegistryError the Schema Registry failed or refused (often transient)
    ├── ValidationError        a JSON event line that does not validate
    ├── TopicConfigError       an existing topic has a config fifolane cannot work with
    ├── ClusterError           the local Apache Kafka could not start / stop
    ├── ExpressionError        an invalid CEL filter/converter (with position)
    ├── ListenerError          a listener registration problem (name clash, unknown name)
    ├── WorkerError            a worker cannot run: no access, duplicate worker id, bad app
    │   ├── AppError           an app or handler uses the handler API wrongly
    │   └── StateError         local state used wrongly (a scan without a group index)
    └── KafkaClientError       a Kafka client call failed (mapped once, in services/worker/kafka.py)
        ├── KafkaRetriableError      it may pass: call again (broker down, time-out)
        ├── TransactionAbortedError  the open transaction must be aborted, then replayed
        ├── RecordRefusedError       Kafka refuses one record (too large, invalid, no topic)
        └── ProducerFatalError       the producer is unusable: make a new one
            └── ProducerFencedError  another producer took over the transactional id

Library errors are wrapped and chained (``raise X(...) from exc``) at the boundary.
"""

from __future__ import annotations

__all__ = [
    "ClusterError",
    "ConfigError",
    "ExpressionError",
    "FifolaneError",
    "KafkaClientError",
    "KafkaRetriableError",
    "ListenerError",
    "LoginRefusedError",
    "ProducerFatalError",
    "ProducerFencedError",
    "RecordRefusedError",
    "SchemaError",
    "SchemaRegistryError",
    "SerializationError",
    "TopicConfigError",
    "TransactionAbortedError",
    "UnknownSchemaError",
    "ValidationError",
    "WorkerError",
    "AppError",
    "StateError",
]


class FifolaneError(Exception):
    """Root of every error fifolane raises on purpose."""


class ConfigError(FifolaneError):
    """Settings could not be loaded: unknown key, wrong type or missing value."""


class LoginRefusedError(ConfigError):
    """Kafka refused the login (SASL) or the TLS handshake: the settings must change."""


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


class WorkerError(FifolaneError):
    """A worker cannot run as configured (says what to fix): no access to a role topic,
    another worker with the same ``--worker-id``, an app that cannot be loaded."""


class AppError(WorkerError):
    """An app or a handler uses the handler API wrongly (says what to change)."""


class StateError(WorkerError):
    """The worker's local state was used in a way it does not support."""


class KafkaClientError(FifolaneError):
    """A Kafka client call failed. ``code`` is librdkafka's error name (``_TIMED_OUT``,
    ``MSG_SIZE_TOO_LARGE``, ...); ``retriable``/``fatal``/``abortable`` are librdkafka's own
    classification of the error; ``refused`` says the error is about one record (too
    large, invalid for its topic), so producing that record again fails again. Raised only by
    services/worker/kafka.py, which maps every ``KafkaException`` to one of the leaves below."""

    def __init__(self, message: str, *, code: str = "", retriable: bool = False,
                 fatal: bool = False, abortable: bool = False, refused: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = retriable
        self.fatal = fatal
        self.abortable = abortable
        self.refused = refused
        #: the topic of the record that failed, when the error is about one (set by the mapping)
        self.topic: str | None = None


class KafkaRetriableError(KafkaClientError):
    """The call may succeed if made again (a broker is down, a leader moving, a time-out)."""


class TransactionAbortedError(KafkaClientError):
    """The open transaction cannot commit: abort it and replay its input."""


class RecordRefusedError(KafkaClientError):
    """Kafka refuses one record for what it is (too large, invalid for its topic, no such
    topic): producing it again will fail again."""


class ProducerFatalError(KafkaClientError):
    """The producer cannot be used any more: replace it with a new one."""


class ProducerFencedError(ProducerFatalError):
    """A newer producer with the same transactional id fenced this one."""
