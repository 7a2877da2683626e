"""Run the real ``fifolane`` CLI in a subprocess: with pipes, or on a pseudo-terminal.

A subprocess has its own JVM, so it can use another Spark master than the test session's
``local[2]`` (Spark allows one SparkContext per process), and its output is exactly what a
user sees. On a pseudo-terminal rich draws its live progress as on a real terminal.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass

__all__ = ["CliResult", "run_cli", "run_cli_on_tty", "strip_ansi"]

_CLI = [sys.executable, "-c", "from fifolane.cli import main; main()"]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][AB0-9]|\r")


@dataclass
class CliResult:
    """Exit code and output of one CLI run (``stderr`` empty on a terminal: it is merged)."""

    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def strip_ansi(text: str) -> str:
    """Text without terminal control sequences and carriage returns."""
    return _ANSI.sub("", text)


def run_cli(args: list[str], env: dict[str, str], timeout: float = 300.0) -> CliResult:
    """``fifolane ARGS`` with stdout and stderr captured (not a terminal)."""
    proc = subprocess.run([*_CLI, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def run_cli_on_tty(args: list[str], env: dict[str, str], timeout: float = 300.0,
                   columns: int = 160) -> CliResult:
    """``fifolane ARGS`` with stdout and stderr on one pseudo-terminal, everything it drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, columns, 0, 0))
    proc = subprocess.Popen([*_CLI, *args], env={**env, "TERM": "xterm-256color"},
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"fifolane {' '.join(args)} ran over {timeout:.0f}s:\n"
                                     + strip_ansi(b"".join(chunks).decode(errors="replace"))[-3000:])
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break  # exited, and nothing more to read
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=60)
    finally:
        os.close(master)
    return CliResult(code, b"".join(chunks).decode(errors="replace"), "")
