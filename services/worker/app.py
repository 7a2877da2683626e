"""The handler API: what a user's application looks like.

    from services.worker import App, Event, GroupState

    app = App("flights")

    @app.handler("reservation")
    def on_reservation(event: Event, state: GroupState) -> None:
        flight = state.get("flight", event.group)
        ...
        state.put("reservation", {**event.value, "state": "CONFIRMED"})

A handler runs for one event at a time per FIFO group, in arrival order; handlers of
different groups run concurrently. It reads and writes the entities of the event's group
through ``state`` and may emit extra output records with ``state.emit``. Writes are
buffered and applied only if the handler returns normally: a handler that raises leaves
no trace (it is retried, then dead-lettered). Handlers may be ``async def`` too.
Event types without a handler get the built-in table handler: apply the upsert or delete.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fifolane.errors import AppError
from services.worker.event import Event

__all__ = ["App", "Event", "GroupState", "HandlerSpec", "Output", "load_app", "table_handler"]


@dataclass(slots=True, frozen=True)
class Output:
    """An extra record a handler sends (committed with the event's effects)."""

    topic: str
    key: bytes | str | None
    value: bytes | str | None
    headers: tuple[tuple[str, bytes], ...] = ()


class GroupState(Protocol):
    """The entities of the event's FIFO group (read your own writes)."""

    def get(self, type_name: str, key: str) -> dict[str, Any] | None: ...

    def put(self, type_name: str, value: dict[str, Any]) -> None: ...

    def delete(self, type_name: str, key: str, version: int) -> None: ...

    def scan(self, type_name: str) -> list[dict[str, Any]]: ...

    def put_children(self, type_name: str, root_key: str, version: int,
                     children: Iterable[dict[str, Any]]) -> None: ...

    def emit(self, topic: str, key: bytes | str | None, value: bytes | str | None,
             headers: Iterable[tuple[str, bytes]] = ()) -> None: ...


HandlerFn = Callable[[Event, GroupState], Any] | Callable[[Event, GroupState], Awaitable[Any]]


@dataclass(slots=True, frozen=True)
class HandlerSpec:
    """A registered handler; ``inline`` handlers are cheap and run on the poll thread."""

    fn: Callable[..., Any]
    is_async: bool
    inline: bool = False


def table_handler(event: Event, state: GroupState) -> None:
    """The built-in handler: the table follows the source (the seeds' indexing case)."""
    if event.op == "delete":
        state.delete(event.type, event.key, event.version)
    else:
        assert event.value is not None
        state.put(event.type, event.value)


_TABLE = HandlerSpec(table_handler, is_async=False, inline=True)


class App:
    """A named set of handlers, found by the worker as ``--app module:attr``."""

    def __init__(self, name: str = "table") -> None:
        self.name = name
        self._handlers: dict[str, HandlerSpec] = {}
        self._stages: dict[str, dict[str, HandlerSpec]] = {}  # type -> stage -> handler

    def handler(self, *types: str, inline: bool = False,
                stage: str | None = None) -> Callable[[HandlerFn], HandlerFn]:
        """Register ``fn`` for the given event types (entity type names from schemas/).

        ``stage``: a multi-stage pipeline over the type's group index property (the field
        declared ``fifolane.group_index``, e.g. a reservation's ``state``). The handler gets
        the type's entities whose index value is ``stage``, and moves them on by writing
        them with another value: the handler of that stage (if any) gets them next. Each stage
        keeps per-group order, never two events of a group in one stage at once, and the
        stages of one group run at the same time (docs/formats.md, "Multi-stage pipelines").
        """
        if not types:
            raise AppError("App.handler needs at least one event type, e.g. @app.handler('reservation')")

        def register(fn: HandlerFn) -> HandlerFn:
            spec = HandlerSpec(fn, asyncio.iscoroutinefunction(fn), inline=inline)
            if spec.is_async and inline:
                raise AppError(f"app {self.name!r}: handler {fn.__name__!r} is async, so it runs on the "
                               "worker's event loop and cannot be inline: drop inline=True")
            for t in types:
                stages = self._stages.get(t, {})
                if (stage is None and (t in self._handlers or stages)) or stage in stages \
                        or (stage is not None and t in self._handlers):
                    what = f"stage {stage!r} of type {t!r}" if stage is not None else f"type {t!r}"
                    raise AppError(f"app {self.name!r}: {what} already has a handler (a type has "
                                   "either one handler or handlers per stage)")
                if stage is None:
                    self._handlers[t] = spec
                else:
                    self._stages.setdefault(t, {})[stage] = spec
            return fn

        return register

    def handler_for(self, type_name: str) -> HandlerSpec:
        """The handler of a type's events (the built-in table handler if it has none, and
        for the events of a staged type whose stage has no handler)."""
        return self._handlers.get(type_name, _TABLE)

    def check(self, catalog: Any) -> None:
        """Refuse handlers of unknown types, and stage handlers of a type without a
        ``fifolane.group_index`` field to hold the stage (:class:`AppError`)."""
        for type_name in self.types:
            entity = catalog.entity(type_name)  # an unknown type is refused there
            if self.stages_of(type_name) and entity.group_index_of is None:
                raise AppError(f"app {self.name!r}: type {type_name!r} has stage handlers but no "
                               "fifolane.group_index field to hold its stage (docs/formats.md)")

    def stages_of(self, type_name: str) -> dict[str, HandlerSpec] | None:
        """The stage handlers of a type (None: it has none)."""
        return self._stages.get(type_name)

    @property
    def has_async(self) -> bool:
        """Whether any handler is ``async def`` (it runs on the worker's event loop)."""
        specs = [*self._handlers.values(), *(spec for st in self._stages.values() for spec in st.values())]
        return any(spec.is_async for spec in specs)

    @property
    def types(self) -> list[str]:
        """The types with a handler of their own (stage handlers included)."""
        return sorted(set(self._handlers) | set(self._stages))


def load_app(spec: str | None) -> App:
    """Import ``module:attr`` (the ``--app`` option); None gives the table-only app.

    The module is looked up on ``sys.path`` and then in the current directory (an app next to
    where the worker is started, like ``examples.flights`` in a checkout). A file path
    (``examples/flights.py``) is taken as the module path it spells. A module or attribute
    that is not there is an :class:`AppError` that says what to give instead."""
    if not spec:
        return App()
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        module_name = _module_of_path(spec, module_name)
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name) or os.getcwd() in sys.path:
                raise
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the app itself imports a module that is missing: its traceback tells where
        raise AppError(f"--app {spec}: no module named {exc.name!r} (looked on the Python path and in "
                       f"{os.getcwd()}); give the app as MODULE:ATTR, e.g. examples.flights:app") from None
    if not hasattr(module, attr):
        apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
        close = difflib.get_close_matches(attr, apps, n=1) or apps[:1]
        hint = f"; did you mean {module_name}:{close[0]}?" if close else " (it defines no services.worker.App)"
        raise AppError(f"--app {spec}: module {module_name} has no attribute {attr!r}{hint}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise AppError(f"--app {spec}: expected a services.worker.App, got {type(app).__name__}")
    return app


def _module_of_path(spec: str, path: str) -> str:
    """The module path of a ``.py`` file under the current directory (``examples/flights.py``
    -> ``examples.flights``); AppError for a file outside it or not there."""
    file = Path(path)
    try:
        rel = file.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        rel = None
    if rel is None or file.suffix != ".py" or not file.is_file() \
            or not all(part.isidentifier() for part in rel.with_suffix("").parts):
        raise AppError(f"--app {spec}: give a module path like examples.flights:app, not a file path "
                       f"(a .py file under the current directory is taken as its module path)")
    return ".".join(rel.with_suffix("").parts)
