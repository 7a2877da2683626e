"""Helpers of the secured-cluster tests: per-user settings, running the CLI as a user."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from fifolane.acls import add_scram_user, apply_role
from fifolane.cluster import LocalCluster
from fifolane.config import PROJECT_ROOT, Settings

__all__ = ["SecureSetup", "cli_env", "error_line", "run_cli"]


@dataclass
class SecureSetup:
    """A test's pipeline on the secured cluster: topics created by the admin."""

    cluster: LocalCluster
    admin: Settings

    def as_user(self, user: str, password: str | None = None) -> Settings:
        """The same topics and home, logged in as SCRAM user ``user``."""
        values = self.admin.model_dump()
        values.update(self.cluster.secure_files.client_settings("admin"))
        values.update(sasl_username=user, sasl_password=password or self.cluster.secure_files.users()[user])
        return Settings(**values)

    def new_user(self, name: str) -> Settings:
        """A new SCRAM user (no ACLs), as the admin makes it (`fifolane acls user`)."""
        return self.as_user(name, add_scram_user(self.admin, name))

    def grant(self, role: str, user: str, **options: Any) -> None:
        apply_role(self.admin, role, f"User:{user}", **options)


def cli_env(settings: Settings) -> dict[str, str]:
    """The environment of a `fifolane` process with exactly these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    for name, value in settings.model_dump().items():
        if value is None or name in ("librdkafka",):
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"FIFOLANE_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    return env


def run_cli(settings: Settings, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``fifolane ARGS`` in its own process, as a user types it (exit code, stdout, stderr)."""
    return subprocess.run([sys.executable, "-c", "from fifolane.cli import main; main()", *args],
                          env=cli_env(settings), capture_output=True, text=True, timeout=timeout,
                          cwd=PROJECT_ROOT, check=False)


def error_line(stderr: str) -> str:
    """The one ``error:`` line fifolane prints (librdkafka's own log lines may come around it)."""
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    return line
