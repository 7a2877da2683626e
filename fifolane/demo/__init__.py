"""The flight-booking demo: ``fifolane demo`` (see docs/walkthrough.md for the same steps by hand)."""

from fifolane.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
