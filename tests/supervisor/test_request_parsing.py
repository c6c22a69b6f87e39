"""The control socket's request parsing as properties, over any bytes and any arguments:
every line gives a request or the error reply that refuses it, and every acting command's
arguments give its typed command or a BadRequest. Nothing raises past these functions.

This is where a malformed request can fail; the live daemon's share of the same proof is
the short smoke in test_control.py (a few hundred fuzzed messages, then it still supervises).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwarden.supervisor.core.policy import ACTING, BadRequest, parse_command
from trainwarden.supervisor.core.requests import MAX_STEP, Pin, Save, Unpin
from trainwarden.supervisor.errors import ProtocolError
from trainwarden.supervisor.serve.connection import parse_request
from trainwarden.supervisor.serve.reads import READS, CommandError, _int_arg
from trainwarden.supervisor.wire import MAX_LINE, decode

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
ARG_NAMES = st.sampled_from(
    ["step", "n", "points", "start", "end", "topics", "wait", "timeout_s", "force", "dry_run",
     "caps", "floors", "run", "x"]
)  # fmt: skip
COMMANDS = st.sampled_from([*READS, *ACTING, "frob", ""])
REQUESTS = st.builds(
    lambda cmd, args, rid: orjson.dumps({"id": rid, "cmd": cmd, **args}),
    COMMANDS,
    st.dictionaries(ARG_NAMES, JSON, max_size=3),
    JSON,
)
LINES = st.one_of(
    REQUESTS,
    JSON.map(orjson.dumps),
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b"")),
)
PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


@PROPERTY
@given(LINES)
def test_any_line_is_a_request_or_the_error_reply_that_refuses_it(line: bytes):
    parsed = parse_request(line)
    if isinstance(parsed, dict):
        assert parsed["ok"] is False and parsed["error"]["code"] == "bad_request"
        assert isinstance(parsed["error"]["message"], str) and parsed["error"]["message"]
        orjson.dumps(parsed)  # the refusal itself can always be sent
        return
    rid, cmd, args = parsed
    message = orjson.loads(line)
    assert rid is None or (isinstance(rid, int | str) and not isinstance(rid, bool))
    assert cmd == message["cmd"] and isinstance(cmd, str)
    assert args == {k: v for k, v in message.items() if k not in ("id", "cmd")}


@PROPERTY
@given(st.binary(max_size=300))
def test_decode_gives_an_object_or_a_protocol_error(line: bytes):
    try:
        message = decode(line)
    except ProtocolError as exc:
        assert str(exc)
        return
    assert isinstance(message, dict)


def test_a_line_over_the_limit_is_refused_unread():
    refusal = parse_request(b'{"cmd": "status", "x": "' + b"a" * MAX_LINE + b'"}')
    assert isinstance(refusal, dict) and "exceeds the" in refusal["error"]["message"]


@PROPERTY
@given(st.sampled_from(ACTING), st.dictionaries(ARG_NAMES, JSON, max_size=4))
def test_any_arguments_give_the_typed_command_or_a_bad_request(cmd: str, args: dict[str, Any]):
    command = parse_command(cmd, args)
    if isinstance(command, BadRequest):
        assert command.code == "bad_argument" and command.message
        return
    if isinstance(command, Save):
        assert command.timeout_s is None or command.timeout_s > 0
    if isinstance(command, Pin | Unpin):
        assert 0 <= command.step <= MAX_STEP


def test_an_unknown_command_is_named_in_its_refusal():
    refusal = parse_command("frob", {})
    assert isinstance(refusal, BadRequest) and refusal.code == "unknown_command"
    assert "'frob'" in refusal.message


@PROPERTY
@given(JSON, st.integers(0, 10), st.one_of(st.none(), st.integers(10, 2**31)))
def test_a_numeric_argument_is_in_range_or_refused_with_its_range(
    value: Any, low: int, high: int | None
):
    try:
        got = _int_arg({"n": value}, "n", None, low, high)
    except CommandError as exc:
        assert exc.code == "bad_argument" and "'n' must be an integer" in str(exc)
        return
    if value is None:
        assert got is None
        return
    assert isinstance(got, int) and not isinstance(got, bool) and got == value
    assert low <= got and (high is None or got <= high)


@pytest.mark.parametrize("value", [True, 1.0, "1", -1, 11])
def test_booleans_floats_strings_and_out_of_range_values_are_refused(value: Any):
    with pytest.raises(CommandError):
        _int_arg({"n": value}, "n", None, 0, 10)
