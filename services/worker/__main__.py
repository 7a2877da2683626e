"""``python -m services.worker [options]``: the container entry point (same as ``fifolane worker``)."""

from __future__ import annotations

import logging
import os

from fifolane.cli.worker import script

if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("FIFOLANE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    script("python -m services.worker")  # errors: one line and exit code 2
