"""What the configured principal may do on a (secured) Kafka, asked before acting on it.

On a cluster with an authorizer a missing permission otherwise shows up late and vaguely: a
wrong password as a metadata time-out, a missing ACL as a client that retries for ever. This
module asks up front and says what is missing, in the words of docs/security.md:

    access = KafkaAccess(settings.kafka_config())
    access.login()                                   # ConfigError: wrong user or password, bad CA
    access.missing({"fifolane.state": ("READ", "WRITE")})   # -> ["WRITE on topic 'fifolane.state'"]

Operations are Kafka's ACL operation names (``READ``, ``WRITE``, ``CREATE``, ``DESCRIBE``,
``DESCRIBE_CONFIGS``...). The broker answers for the connection's own principal (DescribeTopics
with authorized operations), implied operations included (``READ`` implies ``DESCRIBE``). A
cluster without an authorizer allows everything.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Collection, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from fifolane.errors import ConfigError, LoginRefusedError

__all__ = ["KafkaAccess", "TopicAccess", "is_login_error", "kafka_said", "login_refused", "principal_of"]

log = logging.getLogger(__name__)

#: librdkafka error codes that mean "this login will never work": say so, do not retry.
_LOGIN_ERRORS = {KafkaError._AUTHENTICATION: "authentication", KafkaError._SSL: "TLS"}


def principal_of(conf: Mapping[str, Any]) -> str | None:
    """The Kafka principal a SASL client logs in as (``User:<name>``), None without SASL."""
    user = conf.get("sasl.username")
    protocol = str(conf.get("security.protocol", "")).upper()
    return f"User:{user}" if user and protocol.startswith("SASL") else None


def kafka_said(text: str) -> str:
    """librdkafka's error text without the broker address in front and the timing after it
    (``sasl_ssl://h:9092/bootstrap: SSL handshake failed: ... (after 10ms in state X)``)."""
    text = re.sub(r"^\S+://\S+: ", "", text.strip())
    return re.sub(r"\s*\(after \d+ms in state \w+.*\)$", "", text)


def is_login_error(err: KafkaError) -> bool:
    """Does ``err`` say the login or the TLS handshake was refused (no retry can help)?"""
    return err.code() in _LOGIN_ERRORS


def login_refused(err: KafkaError, conf: Mapping[str, Any]) -> LoginRefusedError:
    """The error to show for a refused login or TLS handshake (``err``, see
    :func:`is_login_error`) of a client configured with ``conf``: what failed, and which
    setting to change."""
    bootstrap = conf.get("bootstrap.servers")
    said = kafka_said(err.str())
    if err.code() == KafkaError._AUTHENTICATION:
        user = principal_of(conf)
        who = f"{user} ({conf.get('sasl.mechanism')})" if user else "this client"
        if "invalid credentials" in said:
            return LoginRefusedError(
                f"Kafka at {bootstrap} refused the login of {who}: wrong user name or "
                f"password (FIFOLANE_SASL_USERNAME, FIFOLANE_SASL_PASSWORD)"
            )
        return LoginRefusedError(
            f"Kafka at {bootstrap} refused the login of {who}: {said}; check "
            f"FIFOLANE_SASL_MECHANISM and FIFOLANE_SECURITY_PROTOCOL"
        )
    if "certificate verify failed" in said:
        return LoginRefusedError(
            f"the TLS handshake with Kafka at {bootstrap} failed: the broker's certificate is not "
            f"signed by a CA in FIFOLANE_SSL_CA_LOCATION ({conf.get('ssl.ca.location', 'not set')}); "
            f"set it to the CA that signed the brokers' certificates (`fifolane kafka up --secure` "
            f"prints it)"
        )
    return LoginRefusedError(
        f"the TLS handshake with Kafka at {bootstrap} failed: {said}; check "
        f"FIFOLANE_SSL_CA_LOCATION (the CA that signed the brokers' certificates) and "
        f"FIFOLANE_SECURITY_PROTOCOL"
    )


class TopicAccess:
    """What the principal may do on one topic: ``exists``, ``denied`` (not even DESCRIBE),
    and ``operations`` (names; every operation when the cluster has no authorizer)."""

    __slots__ = ("denied", "exists", "operations", "topic")

    def __init__(self, topic: str, *, exists: bool, denied: bool = False,
                 operations: frozenset[str] | None = None) -> None:
        self.topic = topic
        self.exists = exists
        self.denied = denied
        self.operations = operations  # None: not reported (no authorizer): everything

    def allows(self, operation: str) -> bool:
        if self.denied:
            return False
        return self.operations is None or operation.upper() in self.operations


#: Errors of a describe that another try may not have (a broker frozen or restarting).
_TRANSIENT = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                        KafkaError.REQUEST_TIMED_OUT, KafkaError.LEADER_NOT_AVAILABLE,
                        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NETWORK_EXCEPTION})


class KafkaAccess:
    """Login and permission checks with one admin client (``conf``: librdkafka settings)."""

    def __init__(self, conf: Mapping[str, Any], timeout: float = 20.0) -> None:
        self.conf = dict(conf)
        self.timeout = timeout
        self.principal = principal_of(conf)
        self._errors: list[KafkaError] = []  # login errors, from the client's error callback
        self._logged_in = False
        admin_conf = {k: v for k, v in self.conf.items() if not callable(v)}
        # Not a bound method: the client would then keep this object alive in a cycle, and
        # could outlive its last use (see fifolane.cli.release_clients).
        errors = self._errors
        admin_conf["error_cb"] = lambda err: errors.append(err) if err.code() in _LOGIN_ERRORS else None
        self.admin = AdminClient(admin_conf)

    def close(self) -> None:
        """Destroy the admin client now (its threads end here, not at the interpreter's exit)."""
        self.admin = None  # type: ignore[assignment]

    @property
    def _login_error(self) -> KafkaError | None:
        return self._errors[0] if self._errors else None

    def login(self) -> None:
        """Connect once; :class:`ConfigError` if Kafka refuses the login or the TLS handshake
        fails (at the first refusal, not after a time-out), or no broker answers."""
        if self._logged_in:
            return
        bootstrap = self.conf.get("bootstrap.servers")
        deadline = time.monotonic() + self.timeout
        last: KafkaException | None = None
        while time.monotonic() < deadline:
            try:
                self.admin.list_topics(timeout=1.0)
                self._logged_in = True
                return
            except KafkaException as exc:
                last = exc
            self.admin.poll(0)  # deliver error callbacks
            self._raise_login_error(bootstrap)
        self._raise_login_error(bootstrap)
        raise ConfigError(f"no Kafka broker at {bootstrap} answered within {self.timeout:.0f}s "
                          f"({last}); check FIFOLANE_BOOTSTRAP_SERVERS and FIFOLANE_SECURITY_PROTOCOL")

    def _raise_login_error(self, bootstrap: Any) -> None:
        err = self._login_error
        if err is not None:
            raise login_refused(err, {**self.conf, "bootstrap.servers": bootstrap})

    def topics(self, names: Collection[str]) -> dict[str, TopicAccess]:
        """What the principal may do on each of ``names`` (after :meth:`login`)."""
        self.login()
        names = sorted(set(names))
        if not names:
            return {}
        out: dict[str, TopicAccess] = {}
        deadline = time.monotonic() + self.timeout
        while names:
            futures = self.admin.describe_topics(TopicCollection(names), include_authorized_operations=True,
                                                 request_timeout=max(1.0, deadline - time.monotonic()))
            again: list[str] = []  # a broker that did not answer (frozen, restarting): asked again
            for name, future in futures.items():
                try:
                    desc = future.result()
                except KafkaException as exc:
                    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                    code = err.code() if err is not None else None
                    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        out[name] = TopicAccess(name, exists=True, denied=True, operations=frozenset())
                    elif code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                        out[name] = TopicAccess(name, exists=False)
                    elif code in _TRANSIENT and time.monotonic() < deadline - 1.0:
                        again.append(name)
                    else:
                        raise ConfigError(f"cannot describe topic {name!r}: {exc}") from exc
                    continue
                ops = desc.authorized_operations
                out[name] = TopicAccess(name, exists=True, operations=None if ops is None else
                                        frozenset(op.name for op in ops))  # fmt: skip
            if again:
                log.info("describing topics %s again: a broker did not answer in time", ", ".join(again))
                time.sleep(0.2)
            names = again
        return out

    def group_allows(self, group: str, operation: str = "READ") -> bool:
        """May the principal do ``operation`` on consumer group ``group`` (after :meth:`login`)?

        A coordinator that is not ready (a new cluster creates its offsets topic on first
        use) is asked again until the time-out; if it never answers, True: the consumer will
        find out itself.
        """
        self.login()
        deadline = time.monotonic() + self.timeout
        while True:
            future = self.admin.describe_consumer_groups([group], include_authorized_operations=True,
                                                         request_timeout=self.timeout)[group]
            try:
                desc = future.result()
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    return False
                if time.monotonic() >= deadline:
                    log.warning("cannot check access to consumer group %r: %s", group, exc)
                    return True
                time.sleep(0.2)  # the coordinator is loading or moving
        ops = desc.authorized_operations
        return ops is None or operation.upper() in {op.name for op in ops}

    def missing(self, needs: Mapping[str, Collection[str]]) -> list[str]:
        """The permissions of ``needs`` (topic -> operations) that the principal lacks, as
        ``"WRITE on topic 'x'"``; a topic that does not exist is ``"topic 'x' (does not exist)"``.

        A principal without DESCRIBE cannot tell a missing topic from a forbidden one (Kafka
        answers "not authorized" for both, so as not to reveal topic names): both read as
        lacking every operation asked for.
        """
        found = self.topics(needs.keys())
        out = []
        for topic in sorted(needs):
            acc = found[topic]
            if not acc.exists:
                out.append(f"topic {topic!r} (does not exist)")
                continue
            out.extend(f"{op.upper()} on topic {topic!r}" for op in needs[topic] if not acc.allows(op))
        return out
