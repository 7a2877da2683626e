"""The FIFO-group worker: handler API and runtime.

Public names: :class:`App`, :class:`Event`, :class:`GroupState`, :class:`Output`,
:class:`Worker`, :class:`WorkerOptions`.
"""

from fifolane.compiled import activate

activate(__name__, __path__)  # the compiled modules, if built and current (fifolane/compiled.py)

from services.worker.app import App, Event, GroupState, Output  # noqa: E402
from services.worker.options import WorkerOptions  # noqa: E402

__all__ = ["App", "Event", "GroupState", "Output", "Worker", "WorkerOptions"]


def __getattr__(name: str) -> object:
    # The runtime pulls in confluent-kafka and RocksDB; load it only when asked for.
    if name == "Worker":
        from services.worker.runtime import Worker

        return Worker
    raise AttributeError(name)
