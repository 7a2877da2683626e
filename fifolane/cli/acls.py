"""``fifolane acls apply|remove|list|user``: least-privilege roles on a secured Kafka.

The roles and their ACLs are :mod:`fifolane.acls` (docs/security.md has the table). Run these
as an administrator (a principal with ALTER on the cluster, e.g. the ``admin`` user of
``fifolane kafka up --secure``); the topic names come from the settings.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from fifolane.cli.connect import reachable

__all__ = ["acls"]

_ROLE_HELP = ("producer (write input), worker (its topics, group, transactional ids), listener-admin "
              "(register listeners), listener-reader (read one listener), spark (read the state)")


def _role_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    from fifolane.acls import ROLES

    options = [
        click.option("--role", type=click.Choice(ROLES), required=True, help=_ROLE_HELP),
        click.option("--principal", required=True, help="The principal, User:<SASL user name>."),
        click.option("--app", default="table", show_default=True,
                     help="worker: the app name; its group is fifolane-<app>."),
        click.option("--group-id", default=None, help="worker: the consumer group (as `worker --group-id`)."),
        click.option("--output", "outputs", multiple=True,
                     help="Listener output topic (repeatable; default: the configured one)."),
        click.option("--output-prefix", "output_prefixes", multiple=True,
                     help="worker/listener-admin: output topics starting with this (repeatable)."),
        click.option("--listener", default=None, help="listener-reader: the listener's name."),
        click.option("--renew/--no-renew", default=True, show_default=True,
                     help="listener-reader: renews its lease (needs WRITE on the registry)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _options(app: str, group_id: str | None, outputs: tuple[str, ...], output_prefixes: tuple[str, ...],
             listener: str | None, renew: bool) -> dict[str, Any]:
    return {"app": app, "group_id": group_id, "outputs": list(outputs),
            "output_prefixes": list(output_prefixes), "listener": listener, "renew": renew}


def _show(grants: list[Any], principal: str, verb: str) -> None:
    for g in grants:
        click.echo(f"{verb} {principal}: {g.describe():<60} ({g.why})")


@click.group()
def acls() -> None:
    """Create the Kafka ACLs of fifolane's roles (docs/security.md)."""


@acls.command("apply")
@_role_options
@click.option("--dry-run", is_flag=True, help="Only print the ACLs.")
def apply(role: str, principal: str, dry_run: bool, **opts: Any) -> None:
    """Grant PRINCIPAL the ACLs of ROLE (idempotent)."""
    from fifolane.acls import apply_role, check_principal, role_grants
    from fifolane.config import load_settings

    settings = load_settings()
    options = _options(**opts)
    if dry_run:  # no Kafka needed
        _show(role_grants(role, settings, **options), check_principal(principal), "would allow")
        return
    grants = apply_role(reachable(settings), role, principal, **options)
    _show(grants, principal, "allowed")
    click.echo(f"{len(grants)} ACLs of role {role} for {principal}", err=True)


@acls.command("remove")
@_role_options
def remove(role: str, principal: str, **opts: Any) -> None:
    """Delete the ACLs that `acls apply` made for PRINCIPAL and ROLE."""
    from fifolane.acls import remove_role
    from fifolane.config import load_settings

    grants = remove_role(reachable(load_settings()), role, principal, **_options(**opts))
    _show(grants, principal, "removed")


@acls.command("list")
@click.option("--principal", default=None, help="Only this principal's ACLs.")
def list_(principal: str | None) -> None:
    """Every ACL of the cluster (permission, principal, operation, resource)."""
    from fifolane.acls import list_acls
    from fifolane.config import load_settings

    def name(enum: Any) -> str:  # the stubs also allow str and int here
        return str(getattr(enum, "name", enum))

    for b in list_acls(reachable(load_settings()), principal):
        pattern = "*" if name(b.resource_pattern_type) == "PREFIXED" else ""
        click.echo(f"{name(b.permission_type):<6} {b.principal:<28} {name(b.operation):<17} "
                   f"{name(b.restype).lower()} {b.name}{pattern}")


@acls.command("user")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin (default: a random one).")
def user(name: str, password_stdin: bool) -> None:
    """Create (or reset the password of) SCRAM-SHA-512 user NAME; prints its password."""
    from fifolane.acls import add_scram_user
    from fifolane.config import load_settings

    settings = reachable(load_settings())
    given = sys.stdin.readline().rstrip("\n") if password_stdin else None
    password = add_scram_user(settings, name, given)
    click.echo(f"SCRAM-SHA-512 user {name} (principal User:{name}) set", err=True)
    if not password_stdin:
        click.echo(f"FIFOLANE_SASL_USERNAME={name}\nFIFOLANE_SASL_PASSWORD={password}")
