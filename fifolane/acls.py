"""Least-privilege roles: the Kafka ACLs each fifolane component needs (docs/security.md).

    grants = role_grants("worker", settings, app="flights")
    apply_role(settings, "worker", "User:worker", app="flights")    # creates the ACLs
    add_scram_user(settings, "worker", password)                     # SCRAM-SHA-512 user

Every topic, consumer group and transactional id below is one that fifolane's code uses
(the group ids ``fifolane-<app>``, ``fifolane-restore-*``, ``fifolane-registry-*``,
``fifolane-listen-<name>-*``, ``fifolane-views*``; the transactional ids ``<group>-<worker id>``),
so a principal with its role's ACLs and nothing else can do its job and nothing more.
The topic names come from the settings (``FIFOLANE_*_TOPIC``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from fifolane.config import Settings
from fifolane.errors import ConfigError

__all__ = ["ROLES", "Grant", "add_scram_user", "apply_role", "check_principal", "list_acls",
           "remove_role", "role_grants"]

#: The roles of docs/security.md, in the order a pipeline is set up.
ROLES = ("producer", "worker", "listener-admin", "listener-reader", "spark")
# Throwaway consumer groups (uuid-suffixed) of the clients that read a topic by assignment.
RESTORE_GROUPS = "fifolane-restore-"
REGISTRY_GROUPS = "fifolane-registry-"
PARKED_GROUPS = "fifolane-parked-"
VIEWS_GROUPS = "fifolane-views"


@dataclass(frozen=True)
class Grant:
    """One ALLOW ACL: ``operation`` on ``resource`` (topic, group, transactional_id) ``name``,
    matched literally or as a prefix; ``why`` says which code needs it."""

    resource: str
    name: str
    operation: str
    why: str
    prefixed: bool = False

    def binding(self, principal: str, host: str = "*") -> AclBinding:
        return AclBinding(
            ResourceType[self.resource.upper()], self.name,
            ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL,
            principal, host, AclOperation[self.operation], AclPermissionType.ALLOW,
        )

    def describe(self) -> str:
        pattern = f"{self.name}*" if self.prefixed else self.name
        return f"{self.operation} on {self.resource.replace('_', ' ')} {pattern}"


def check_principal(principal: str) -> str:
    """``User:<name>``, the form Kafka's SASL principals take; ConfigError otherwise."""
    kind, _, name = principal.partition(":")
    if kind != "User" or not name:
        raise ConfigError(f"invalid principal {principal!r}: give it as User:<name> (the SASL user name)")
    return principal


def _topics(names: Iterable[str], ops: Sequence[str], why: str, *, prefixed: bool = False) -> list[Grant]:
    return [Grant("topic", n, op, why, prefixed) for n in dict.fromkeys(names) for op in ops]


def role_grants(role: str, settings: Settings, *, app: str = "table", group_id: str | None = None,
                outputs: Sequence[str] = (), output_prefixes: Sequence[str] = (),
                listener: str | None = None, renew: bool = True) -> list[Grant]:
    """The ACLs of ``role`` (one of :data:`ROLES`) for the topics of ``settings``.

    ``app``/``group_id``: the worker's consumer group (default ``fifolane-<app>``), also the
    prefix of its transactional ids. ``outputs``/``output_prefixes``: listener output topics
    (default: the configured one) the worker writes, the listener admin may register, the
    listener reader (one topic) and Spark read. ``listener``: the reader's listener name;
    ``renew``: whether the reader renews its lease (which needs WRITE on the registry).
    """
    s = settings
    outs = list(outputs) or ([] if output_prefixes else [s.listener_output_topic])
    if role == "producer":
        return _topics([s.input_topic], ["WRITE"], "fifolane produce / EventProducer: send events")
    if role == "worker":
        group = group_id or f"fifolane-{app}"
        return [
            *_topics([s.input_topic], ["READ", "WRITE", "DESCRIBE_CONFIGS"],
                     "consume events; write move-out control records; max.message.bytes"),
            *_topics([s.state_topic, s.directory_topic], ["READ", "WRITE", "DESCRIBE_CONFIGS"],
                     "restore and write the table and the entity directory; delete.retention.ms"),
            *_topics([s.dlq_topic], ["WRITE", "DESCRIBE_CONFIGS"], "dead letters (cut to max.message.bytes)"),
            *_topics([s.parked_topic], ["READ", "WRITE", "DESCRIBE_CONFIGS"],
                     "parked groups (--on-failure park): held events, restored with a partition"),
            *_topics([s.registry_topic], ["READ", "WRITE"],
                     "follow listener registrations; write snapshot progress and status records"),
            *_topics(outs, ["WRITE", "DESCRIBE_CONFIGS"], "listener notifications"),
            *_topics(output_prefixes, ["WRITE", "DESCRIBE_CONFIGS"], "listener notifications", prefixed=True),
            *_topics([s.members_topic], ["READ", "WRITE"],
                     "heartbeats (one live worker per --worker-id); the query endpoint's address"),
            Grant("group", group, "READ", "the worker's consumer group (offsets in transactions)"),
            Grant("group", RESTORE_GROUPS, "READ", "restore consumers (assigned partitions)", True),
            Grant("group", REGISTRY_GROUPS, "READ", "the registry follower (assigned partition)", True),
            Grant("group", PARKED_GROUPS, "READ", "parked-topic readers (assigned partitions)", True),
            Grant("transactional_id", f"{group}-", "WRITE", "exactly-once: transactional id <group>-<worker id>", True),
        ]
    if role == "listener-admin":
        return [
            *_topics([s.registry_topic], ["READ", "WRITE"], "fifolane listeners add/remove/list/describe"),
            *_topics([s.input_topic], ["DESCRIBE"], "partition count of a new output topic"),
            *_topics(outs, ["CREATE", "WRITE", "DESCRIBE_CONFIGS"],
                     "output topics it may name (created at registration; a compacted one is refused)"),
            *_topics(output_prefixes, ["CREATE", "WRITE", "DESCRIBE_CONFIGS"], "output topics it may name",
                     prefixed=True),
            Grant("group", REGISTRY_GROUPS, "READ", "reading the registry (assigned partition)", True),
        ]
    if role == "listener-reader":
        if listener is None:
            raise ConfigError("the listener-reader role is for one listener: give --listener NAME")
        if len(outs) != 1 or output_prefixes:
            raise ConfigError("the listener-reader role reads one output topic: give at most one --output")
        return [
            *_topics(outs, ["READ"], f"fifolane listen {listener}"),
            *_topics([s.registry_topic], ["READ", "WRITE"] if renew else ["READ"],
                     "its registration" + ("; renew its lease" if renew else "")),
            Grant("group", f"fifolane-listen-{listener}-", "READ", "the listen consumer (assigned partitions)", True),
            Grant("group", REGISTRY_GROUPS, "READ", "reading the registry (assigned partition)", True),
        ]
    if role == "spark":
        return [
            *_topics([s.state_topic], ["READ", "DESCRIBE_CONFIGS"], "views build; the history window of --as-of"),
            *_topics(outputs, ["READ"], "listener topics read by Spark"),
            Grant("group", VIEWS_GROUPS, "READ", "Spark's Kafka source and the --as-of offset lookup", True),
        ]
    raise ConfigError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}")


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(settings.kafka_config())


def _acl_error(exc: KafkaException, what: str, settings: Settings) -> ConfigError:
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is not None and err.code() in (KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                                          KafkaError.SECURITY_DISABLED):  # fmt: skip
        who = settings.sasl_username or "this client"
        fix = ("the cluster has no authorizer (ACLs are off)" if err.code() == KafkaError.SECURITY_DISABLED
               else f"{who} lacks ALTER on the cluster: run it as an administrator (the admin user "
                    f"of `fifolane kafka up --secure`)")
        return ConfigError(f"{what} refused: {fix}")
    return ConfigError(f"{what} failed: {exc}")


def apply_role(settings: Settings, role: str, principal: str, **options: object) -> list[Grant]:
    """Create the ACLs of ``role`` for ``principal`` (idempotent); returns them."""
    check_principal(principal)
    grants = role_grants(role, settings, **options)  # type: ignore[arg-type]
    admin = _admin(settings)  # referenced until the futures are done: they die with it
    futures = admin.create_acls([g.binding(principal) for g in grants], request_timeout=30)
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            raise _acl_error(exc, f"creating the {role} ACLs for {principal}", settings) from exc
    return grants


def remove_role(settings: Settings, role: str, principal: str, **options: object) -> list[Grant]:
    """Delete the ACLs that :func:`apply_role` made for ``principal``; returns them."""
    check_principal(principal)
    grants = role_grants(role, settings, **options)  # type: ignore[arg-type]
    filters = []
    for g in grants:
        b = g.binding(principal)
        filters.append(AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                        b.operation, b.permission_type))  # fmt: skip
    admin = _admin(settings)
    futures = admin.delete_acls(filters, request_timeout=30)
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            raise _acl_error(exc, f"deleting the {role} ACLs of {principal}", settings) from exc
    return grants


def list_acls(settings: Settings, principal: str | None = None) -> list[AclBinding]:
    """Every ACL of the cluster (of ``principal`` only, if given), sorted."""
    # None matches any name, principal or host (the stubs say str).
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None,  # type: ignore[arg-type]
                           AclOperation.ANY, AclPermissionType.ANY)
    admin = _admin(settings)
    try:
        found = admin.describe_acls(flt, request_timeout=30).result()
    except KafkaException as exc:
        raise _acl_error(exc, "listing ACLs", settings) from exc
    return sorted(found, key=lambda b: (b.principal, b.restype.name, b.name, b.operation.name))


def add_scram_user(settings: Settings, user: str, password: str | None = None,
                   iterations: int = 8192) -> str:
    """Create (or reset) the SCRAM-SHA-512 user ``user``; returns its password (a new random
    one unless given)."""
    if not user or ":" in user or "," in user or "=" in user:
        raise ConfigError(f"invalid user name {user!r}: no ':', ',' or '=' (and not empty)")
    password = password or secrets.token_urlsafe(18)
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, iterations), password.encode())
    admin = _admin(settings)
    futures = admin.alter_user_scram_credentials([upsert], request_timeout=30)
    try:
        futures[user].result()
    except KafkaException as exc:
        raise _acl_error(exc, f"creating SCRAM user {user!r}", settings) from exc
    return password
