"""``python -m fifolane.cli``: the same as the ``fifolane`` command."""

from fifolane.cli import main

main()
