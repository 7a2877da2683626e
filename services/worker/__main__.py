"""``python -m services.worker [options]``: the container entry point (same as ``fifolane worker``)."""

from __future__ import annotations

import logging
import os
import sys

from fifolane.cli import release_clients
from fifolane.cli.worker import worker
from fifolane.errors import FifolaneError

if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("FIFOLANE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        worker(prog_name="python -m services.worker")
    except FifolaneError as exc:  # one clear line and exit code 2, as `fifolane worker` gives
        print(f"error: {exc}", file=sys.stderr)
        release_clients()
        sys.exit(2)
