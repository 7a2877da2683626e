"""The topic roles of docs/formats.md: create them idempotently, refuse ones that do not fit.

    ensure_topics(settings)            create what is missing, validate what exists
    create_topic(settings, name, ...)  one topic, created if missing (tests, demos, listeners)
    describe_topics(settings)          what exists now, per role (for `fifolane topics describe`)

Replication: ``settings.replication_factor`` (``FIFOLANE_REPLICATION_FACTOR``) unless a call
gives one; -1, the default, means the brokers' ``default.replication.factor``, so the same
command makes RF 1 topics on one broker and RF 3 topics on a 3-broker cluster
(``fifolane kafka up --brokers 3``, docker-compose). The replication a topic got is read back.

An existing topic with a config fifolane cannot work with (a state topic that is not compacted,
a registry with more than one partition, a state topic whose partition count differs from the
input's) is refused with :class:`TopicConfigError`, never silently altered: changing partition
counts or cleanup policies of live topics moves or loses data, and that is the operator's call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from fifolane.config import Settings
from fifolane.errors import TopicConfigError

__all__ = [
    "DEFAULT_HISTORY_WINDOW_MS",
    "ROLES",
    "TopicSpec",
    "TopicState",
    "broker_count",
    "create_topic",
    "describe_topics",
    "ensure_topics",
    "role_names",
    "topic_specs",
]

#: How long the state topic keeps superseded values before compaction may drop them
#: (``min.compaction.lag.ms``): the reach of "as of time T" views.
DEFAULT_HISTORY_WINDOW_MS = 60 * 60 * 1000
_DELETE_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
#: Role names, in creation order (input first: the others follow its partition count).
ROLES = ("input", "state", "registry", "dlq", "listener_output", "directory", "parked", "members")
#: Configs shown by describe and kept in TopicState.
_SHOWN_CONFIGS = (
    "cleanup.policy", "min.compaction.lag.ms", "delete.retention.ms", "retention.ms", "min.insync.replicas",
    "segment.ms",
)


@dataclass(frozen=True)
class TopicSpec:
    """What a role needs: name, partitions (None = any), configs set at creation, configs checked."""

    role: str
    name: str
    partitions: int | None
    config: dict[str, str]
    required: dict[str, str]


@dataclass(frozen=True)
class TopicState:
    """A topic as it exists on the cluster."""

    role: str
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]
    created: bool = False


def role_names(settings: Settings) -> dict[str, str]:
    """Topic name of every role, by role, from the settings."""
    return {
        "input": settings.input_topic,
        "state": settings.state_topic,
        "registry": settings.registry_topic,
        "dlq": settings.dlq_topic,
        "listener_output": settings.listener_output_topic,
        "directory": settings.directory_topic,
        "parked": settings.parked_topic,
        "members": settings.members_topic,
    }


def topic_specs(settings: Settings, partitions: int, history_window_ms: int | None = None) -> list[TopicSpec]:
    """The five roles for ``partitions`` input partitions (docs/formats.md, "Topic roles")."""
    names = role_names(settings)
    lag = str(DEFAULT_HISTORY_WINDOW_MS if history_window_ms is None else history_window_ms)
    delete = {"cleanup.policy": "delete"}
    compact = {"cleanup.policy": "compact"}
    return [
        TopicSpec("input", names["input"], partitions, delete, delete),
        TopicSpec(
            "state", names["state"], partitions,
            {**compact, "min.compaction.lag.ms": lag, "delete.retention.ms": str(_DELETE_RETENTION_MS)},
            compact,
        ),
        TopicSpec("registry", names["registry"], 1, compact, compact),
        # Any partition count will do for the DLQ; it follows the input's by default.
        TopicSpec("dlq", names["dlq"], None, delete, delete),
        TopicSpec("listener_output", names["listener_output"], partitions, delete, delete),
        # Keyed by entity key: any partition count works; it follows the input's by default.
        TopicSpec("directory", names["directory"], None, compact, compact),
        # Parked groups live in their group's partition number.
        TopicSpec("parked", names["parked"], partitions, compact, compact),
        # Per worker its query address and its heartbeat (one a second: services.worker.
        # liveness); any partition count works, one keeps a client's read of it to one
        # partition. Hourly segments: compaction cleans only closed ones.
        TopicSpec("members", names["members"], 1, {**compact, "segment.ms": str(3_600_000)}, compact),
    ]


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(settings.kafka_config())


def _replication(settings: Settings, explicit: int | None) -> int:
    """The replication factor to create with: ``explicit``, else the setting (-1 = brokers' default)."""
    rf = settings.replication_factor if explicit is None else explicit
    if rf == 0 or rf < -1:
        raise TopicConfigError(
            f"invalid replication factor {rf}: give 1 or more, or -1 for the brokers' "
            f"default.replication.factor"
        )
    return rf


def _describe_rf(rf: int) -> str:
    return "the brokers' default replication" if rf == -1 else f"replication {rf}"


def broker_count(settings: Settings, timeout: float = 30.0) -> int:
    """How many brokers the cluster has now (for warnings about under-replicated topics)."""
    try:
        return len(_admin(settings).list_topics(timeout=timeout).brokers)
    except KafkaException as exc:
        raise TopicConfigError(f"cannot reach the cluster: {exc}") from exc


def _existing(admin: AdminClient, names: list[str], timeout: float) -> dict[str, TopicState]:
    """Partitions, replication and key configs of those ``names`` that exist."""
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TopicConfigError(f"cannot list topics: {exc}") from exc
    present = sorted({n for n in names if n in md.topics and md.topics[n].error is None})
    if not present:
        return {}
    configs: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + timeout
    todo = list(present)
    while todo:
        resources = [ConfigResource(ResourceType.TOPIC, n) for n in todo]
        retry = []
        for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
            try:
                entries = future.result(timeout=timeout)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                # Just created: the broker asked may not know the topic yet (3 nodes).
                if (isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                        and time.monotonic() < deadline):
                    retry.append(resource.name)
                    continue
                raise TopicConfigError(f"cannot describe topic {resource.name!r}: {exc}") from exc
            configs[resource.name] = {k: str(v.value) for k, v in entries.items() if k in _SHOWN_CONFIGS}
        todo = retry
        if todo:
            time.sleep(0.1)  # metadata propagation; bounded by the deadline
    out = {}
    for name in present:
        parts = md.topics[name].partitions
        rf = len(next(iter(parts.values())).replicas) if parts else 0
        out[name] = TopicState("", name, len(parts), rf, configs.get(name, {}))
    return out


def _create(
    admin: AdminClient, name: str, partitions: int, replication_factor: int,
    config: dict[str, str], timeout: float,
) -> bool:
    """Create one topic; False if it already existed (a concurrent creator is fine)."""
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=config)],
        request_timeout=timeout,
    )
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise TopicConfigError(
            f"creating topic {name!r} ({partitions} partitions, {_describe_rf(replication_factor)}, "
            f"{config}) failed: {exc}"
        ) from exc
    return True


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait until every partition of ``names`` has a leader, so the first produce succeeds."""
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        ready = all(
            n in md.topics and md.topics[n].error is None and md.topics[n].partitions
            and all(p.leader >= 0 for p in md.topics[n].partitions.values())
            for n in names
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise TopicConfigError(f"topics {names} have no leader after {timeout:.0f}s")
        time.sleep(0.05)  # metadata propagation after a create; bounded by the deadline


def create_topic(
    settings: Settings,
    name: str,
    partitions: int,
    config: dict[str, str] | None = None,
    *,
    replication_factor: int | None = None,
    timeout: float = 30.0,
) -> bool:
    """Create ``name`` if it does not exist (no validation of an existing one); True if created.

    ``replication_factor`` defaults to ``settings.replication_factor`` (-1: the brokers' default).
    """
    rf = _replication(settings, replication_factor)
    admin = _admin(settings)
    created = _create(admin, name, partitions, rf, dict(config or {}), timeout)
    _wait_for_leaders(admin, [name], timeout)
    return created


def _problems(spec: TopicSpec, state: TopicState, input_partitions: int) -> list[str]:
    """What is wrong with an existing topic for its role, each with how to fix it."""
    problems = []
    for key, expected in spec.required.items():
        actual = state.config.get(key)
        if actual != expected:
            problems.append(
                f"topic {state.name!r} ({spec.role}): {key} is {actual!r}, expected {expected!r}; fix: "
                f"kafka-configs.sh --alter --entity-type topics --entity-name {state.name} "
                f"--add-config {key}={expected} (or delete the topic and run `fifolane topics create`)"
            )
    if spec.partitions is not None and state.partitions != spec.partitions:
        why = "must be 1 (one registry partition keeps registrations in order)" if spec.role == "registry" \
            else f"must equal the input topic's partition count ({input_partitions})"
        problems.append(
            f"topic {state.name!r} ({spec.role}): partitions is {state.partitions}, expected "
            f"{spec.partitions}: it {why}; fix: delete and recreate it with `fifolane topics create`, "
            f"or use another name (FIFOLANE_{spec.role.upper()}_TOPIC)"
        )
    return problems


def ensure_topics(
    settings: Settings,
    partitions: int | None = None,
    replication_factor: int | None = None,
    *,
    history_window_ms: int | None = None,
    timeout: float = 30.0,
) -> dict[str, TopicState]:
    """Create the missing role topics and validate the existing ones; returns them by role.

    ``partitions`` defaults to the existing input topic's count, else ``settings.partitions``;
    an explicit value that differs from an existing input topic is refused.
    ``replication_factor`` defaults to ``settings.replication_factor``, whose default, -1, means
    the brokers' ``default.replication.factor`` (so one command fits 1 or 3 brokers). Raises
    :class:`TopicConfigError` listing every problem found, before creating anything.
    """
    names = role_names(settings)
    shared = {n for n in names.values() if list(names.values()).count(n) > 1}
    if shared:
        roles = ", ".join(f"{r}={n}" for r, n in names.items() if n in shared)
        raise TopicConfigError(f"roles must use distinct topics, but {roles}; fix the FIFOLANE_*_TOPIC settings")
    rf = _replication(settings, replication_factor)
    admin = _admin(settings)
    existing = _existing(admin, list(names.values()), timeout)
    current_input = existing.get(names["input"])
    if current_input is not None and partitions is not None and current_input.partitions != partitions:
        raise TopicConfigError(
            f"topic {current_input.name!r} (input): partitions is {current_input.partitions}, "
            f"expected {partitions}; changing it moves groups to other partitions and breaks "
            f"per-group order; fix: drop --partitions, or use a new input topic name (FIFOLANE_INPUT_TOPIC)"
        )
    n = current_input.partitions if current_input else partitions or settings.partitions
    specs = topic_specs(settings, n, history_window_ms)
    problems = [p for s in specs if s.name in existing for p in _problems(s, existing[s.name], n)]
    if problems:
        raise TopicConfigError("\n".join(problems))
    result: dict[str, TopicState] = {}
    created_names = []
    for spec in specs:
        if spec.name in existing:
            result[spec.role] = replace(existing[spec.name], role=spec.role)
            continue
        count = spec.partitions or n
        created = _create(admin, spec.name, count, rf, spec.config, timeout)
        if not created:  # lost a race with another creator: validate what it made
            state = _existing(admin, [spec.name], timeout)[spec.name]
            errors = _problems(spec, state, n)
            if errors:
                raise TopicConfigError("\n".join(errors))
            result[spec.role] = replace(state, role=spec.role)
            continue
        created_names.append(spec.name)
        result[spec.role] = TopicState(spec.role, spec.name, count, rf, dict(spec.config), created=True)
    if created_names:
        _wait_for_leaders(admin, created_names, timeout)
        # Read back what the broker made (replication -1 = its default.replication.factor).
        # The broker asked next may not list a topic created a moment ago (3 nodes: each
        # learns of it in its own time); until it does, ask again. (Without the retry, such
        # a topic kept replication -1 and was warned about as under-replicated.)
        deadline = time.monotonic() + timeout
        made = _existing(admin, created_names, timeout)
        while len(made) < len(created_names) and time.monotonic() < deadline:
            time.sleep(0.1)  # metadata propagation; bounded by the deadline
            made = _existing(admin, created_names, timeout)
        for role, state in result.items():
            if state.name in made:
                result[role] = replace(made[state.name], role=role, created=True)
    return result


def describe_topics(settings: Settings, timeout: float = 30.0) -> dict[str, TopicState | None]:
    """Every role's topic as it exists now (None if missing)."""
    names = role_names(settings)
    existing = _existing(_admin(settings), list(names.values()), timeout)
    return {
        role: replace(existing[name], role=role) if name in existing else None
        for role, name in names.items()
    }
