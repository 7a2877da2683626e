"""Options and expressions the CLI refuses before it asks Kafka anything, with what to fix:
a lease too short to renew, a negative idle time-out, an empty FIFO group, and the caret of
an error in a multi-line expression (under the position's own line, not past its end)."""

from __future__ import annotations

from click.testing import CliRunner

from fifolane.cli import cli


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output


def test_a_lease_shorter_than_a_second_is_refused() -> None:
    code, out = _run("listeners", "add", "x", "--filter", "true", "--lease", "1ms")
    assert code == 2
    assert out.startswith("error: --lease 1ms is shorter than 1s")


def test_a_negative_listen_timeout_is_a_usage_error() -> None:
    code, out = _run("listen", "x", "--timeout", "-1")
    assert code == 2 and "Invalid value for '--timeout': -1.0 is not in the range x>=0" in out
    code, out = _run("listen", "x", "--timeout", "nan")  # it never stopped
    assert code == 2 and "Invalid value for '--timeout': nan is not a number of seconds" in out


def test_an_empty_group_is_a_usage_error() -> None:
    for args in (("scan", "--group", ""), ("get", "reservation", "R1", "--group", "")):
        code, out = _run(*args)
        assert code == 2 and "Invalid value for '--group': give a FIFO group value: it must not be empty" in out
    code, out = _run("get", "reservation", "")
    assert code == 2 and "Invalid value for 'KEY': give an entity key: it must not be empty" in out


def test_the_caret_of_a_multi_line_expression_is_under_its_line() -> None:
    source = "value.amount > 1.0 &&\n  value.amount >"
    code, out = _run("listeners", "add", "x", "--filter", source)
    assert code == 2
    lines = out.splitlines()
    assert lines[0].startswith("error: invalid filter")
    assert lines[1:] == ["  (line 2)", "    value.amount >", "  " + " " * len("  value.amount >") + "^"]


def test_the_caret_keeps_the_tabs_of_its_line() -> None:
    source = "{\n\t\"a\": nope}"
    code, out = _run("listeners", "add", "x", "--filter", "true", "--convert", source)
    assert code == 2
    assert out.splitlines()[-2:] == ["  \t\"a\": nope}", "  \t" + " " * len('"a": ') + "^"]
