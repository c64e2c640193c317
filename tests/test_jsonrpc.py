"""The public JSON-RPC helpers: builders check their inputs, readers never raise.

Also: ``ErrorCodes`` and ``a2a_secure.errors`` agree, the SDK writes every envelope through
the helpers (no other module spells one out), the bytes on the wire are those of before,
and the optional response members are ignored by the SDK's own client over real HTTP.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a2a_secure import errors, jsonrpc
from a2a_secure.client.http import A2AClient
from a2a_secure.identity import encoding
from a2a_secure.jsonrpc import (
    ErrorCodes,
    error,
    get_agent_card,
    get_error,
    get_hints,
    get_remaining,
    get_result,
    is_error,
    is_success,
    partial,
    request,
    success,
)
from a2a_secure.protocol.wire import encode_error, encode_request, encode_result
from a2a_secure.testing import serve_app
from tests.http_helpers import JSON, build_server, identity

PACKAGE = Path(__file__).resolve().parents[1] / "a2a_secure"
READERS = (is_success, is_error, get_result, get_error, get_hints, get_agent_card, get_remaining)


# -- builders ------------------------------------------------------------------------------------


def test_builders_write_the_members_in_wire_order() -> None:
    assert list(request("echo", {"a": 1}, "r-1").items()) == [
        ("jsonrpc", "2.0"),
        ("method", "echo"),
        ("params", {"a": 1}),
        ("id", "r-1"),
    ]
    assert list(success(7, {"x": 1})) == ["jsonrpc", "id", "result"]
    assert error(None, -32700, "parse error") == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "parse error"},
    }
    assert error(1, ErrorCodes.UNAVAILABLE, "busy", {"retry_after": 2})["error"] == {
        "code": -32048,
        "message": "busy",
        "data": {"retry_after": 2},
    }
    assert type(error(1, ErrorCodes.UNAVAILABLE, "busy")["error"]["code"]) is int
    assert partial("p", [1, 2], 3) == {"jsonrpc": "2.0", "id": "p", "result": [1, 2], "remaining": 3}
    full = success("s", None, hints={"next": "summarize"}, agent_card={"name": "x"})
    assert list(full) == ["jsonrpc", "id", "result", "hints", "agent_card"]
    assert request("tasks/get", ["t-1"], 2, metadata={"trace": "abc"})["metadata"] == {"trace": "abc"}


def test_the_bytes_are_those_the_sdk_wrote_before() -> None:
    # The SDK's bodies are the builders' dicts, encoded: same members, same order, same bytes.
    result = {"status": "success", "sequence": 1, "result": {"t": "é"}, "response_jws": "a.b.c"}
    before = b'{"jsonrpc":"2.0","id":"req-1","result":' + encoding.dumps(result) + b"}"
    assert encode_result("req-1", result) == before == encoding.dumps(success("req-1", result))
    err = {"code": -32043, "message": "unknown session"}
    assert encode_error(None, err) == b'{"jsonrpc":"2.0","id":null,"error":' + encoding.dumps(err) + b"}"
    assert encoding.dumps(error(None, -32043, "unknown session")) == encode_error(None, err)
    params = {"session_id": "s", "sequence": 1}
    assert encode_request("intent", params, 3) == encoding.dumps(request("intent", params, 3))
    assert encode_request("intent", params, 3) == b'{"jsonrpc":"2.0","method":"intent","params":' + (
        encoding.dumps(params) + b',"id":3}'
    )


BAD_BUILDS: dict[str, tuple[Any, type[Exception], str]] = {
    "method-type": (lambda: request(5, {}, 1), TypeError, "method must be a str, not int"),
    "method-empty": (lambda: request("", {}, 1), ValueError, "method must not be empty"),
    "params-type": (lambda: request("m", "x", 1), TypeError, "params must be a JSON object or array"),
    "params-keys": (lambda: request("m", {1: "x"}, 1), TypeError, "params member names must be str"),
    "id-none": (lambda: request("m", {}, None), ValueError, "a request needs an id"),
    "id-float": (lambda: request("m", {}, 1.0), TypeError, "id must be a str, an int or None, not float"),
    "id-bool": (lambda: success(True, 1), TypeError, "not bool"),
    "id-list": (lambda: error([1], -32600, "x"), TypeError, "not list"),
    "id-long": (lambda: request("m", {}, "x" * 129), ValueError, "at most 128 characters"),
    "id-huge": (lambda: success(2**53, 1), ValueError, "within ±(2**53 - 1)"),
    "metadata-protocol": (
        lambda: request("intent", {}, 1, metadata={"a": 1}),
        ValueError,
        "metadata cannot travel with 'intent'",
    ),
    "metadata-type": (lambda: request("m", {}, 1, metadata=[1]), TypeError, "metadata must be a JSON object"),
    "hints-type": (lambda: success(1, 1, hints="go"), TypeError, "hints must be a JSON object"),
    "card-type": (lambda: success(1, 1, agent_card=[]), TypeError, "agent_card must be a JSON object"),
    "code-str": (lambda: error(1, "-32600", "x"), TypeError, "code must be an int, not str"),
    "code-bool": (lambda: error(1, False, "x"), TypeError, "code must be an int, not bool"),
    "code-float": (lambda: error(1, -32600.0, "x"), TypeError, "code must be an int, not float"),
    "code-huge": (lambda: error(1, -(2**60), "x"), ValueError, "code must lie within"),
    "message-type": (lambda: error(1, -32600, None), TypeError, "message must be a str, not NoneType"),
    "remaining-negative": (lambda: partial(1, [], -1), ValueError, "remaining must lie within 0"),
    "remaining-bool": (lambda: partial(1, [], True), TypeError, "remaining must be an int, not bool"),
    # Values inside the envelope: "ready for any JSON encoder" only if they are JSON.
    "result-object": (lambda: success(1, {"a": [object()]}), TypeError, "result holds a object"),
    "result-set": (lambda: partial(1, {1, 2}, 0), TypeError, "result holds a set"),
    "params-nan": (lambda: request("m", [float("nan")], 1), ValueError, "params holds a non-finite number"),
    "data-keys": (lambda: error(1, -32600, "x", data={1: 2}), TypeError, "data member names must be str"),
    "hints-value": (lambda: success(1, 1, hints={"a": b"x"}), TypeError, "hints holds a bytes"),
    "metadata-inf": (lambda: request("m", {}, 1, metadata={"a": float("inf")}), ValueError, "non-finite"),
    "result-deep": (lambda: success(1, _nested(10_000)), ValueError, "result is nested deeper than"),
}


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("case", sorted(BAD_BUILDS))
def test_builders_refuse_bad_inputs_with_clear_messages(case: str) -> None:
    build, exc_type, message = BAD_BUILDS[case]
    with pytest.raises(exc_type) as exc:
        build()
    assert message in str(exc.value)


def test_metadata_is_refused_for_every_protocol_method() -> None:
    for method in ("hello", "proof", "accept_policy", "intent", "close"):
        with pytest.raises(ValueError, match=r"PROTOCOL\.md servers refuse unknown members"):
            request(method, {}, 1, metadata={})
        assert "metadata" not in request(method, {}, 1)


# -- ErrorCodes and errors.py --------------------------------------------------------------------


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).upper()


def test_error_codes_are_those_of_the_exception_tree() -> None:
    # One source of truth: every code of errors.py is an ErrorCodes member named after its
    # class, and every member is the code of that class.
    classes = {
        cls.code: cls
        for name in errors.__all__
        if isinstance(cls := getattr(errors, name), type) and issubclass(cls, errors.A2AError)
        if cls.__bases__ == (errors.A2AError,)  # subclasses share their parent's code
    }
    assert {int(m) for m in ErrorCodes} == set(classes)
    for member in ErrorCodes:
        cls = classes[member]
        assert member.name == _snake(cls.__name__), (member, cls)
        assert type(errors.error_for_code(member, "m")) is cls
    assert {-32700, -32600, -32601, -32602, -32603} <= set(ErrorCodes)
    assert set(range(-32049, -32039)) <= set(ErrorCodes)


# -- readers -------------------------------------------------------------------------------------


def test_readers_on_well_formed_envelopes() -> None:
    ok = success("a", {"x": 1}, hints={"h": 1}, agent_card={"name": "n"})
    assert is_success(ok) and not is_error(ok)
    assert get_result(ok) == {"x": 1}
    assert get_hints(ok) == {"h": 1} and get_agent_card(ok) == {"name": "n"}
    assert get_error(ok) is None and get_remaining(ok) is None
    bad = error(3, ErrorCodes.SEQUENCE_ERROR, "sequence 4 is not greater than 7", {"k": [1]})
    assert is_error(bad) and not is_success(bad)
    assert get_error(bad) == {
        "code": -32044,
        "message": "sequence 4 is not greater than 7",
        "data": {"k": [1]},
    }
    assert get_result(bad) is None and get_hints(bad) is None and get_agent_card(bad) is None
    part = partial(None, "chunk", 2)
    assert is_success(part) and get_remaining(part) == 2 and get_result(part) == "chunk"
    assert is_success(json.loads(encode_result(1, None))) and get_result(success(1, None)) is None
    # Read through a dict subclass (OrderedDict) just the same.
    assert is_success(OrderedDict(ok)) and get_result(OrderedDict(ok)) == {"x": 1}


def test_readers_take_the_gateway_metadata_form_too() -> None:
    # A gateway that puts the hints and the card under a top-level "metadata".
    meta = {**success("m", 1), "metadata": {"context_hints": {"h": 2}, "agent_card": {"name": "g"}}}
    assert get_hints(meta) == {"h": 2} and get_agent_card(meta) == {"name": "g"}
    # The top-level member, when there is one, is what the response says, even a null.
    both = {**success("m", 1, hints={"h": 1}, agent_card={"name": "n"}), "metadata": meta["metadata"]}
    assert get_hints(both) == {"h": 1} and get_agent_card(both) == {"name": "n"}
    null = {**success("m", 1), "hints": None, "metadata": meta["metadata"]}
    assert get_hints(null) is None and get_agent_card(null) == {"name": "g"}
    # A malformed metadata, or one of an error response, reads as nothing.
    for junk in (None, [], "x", {"context_hints": [1], "agent_card": "c"}):
        body = {**success("m", 1), "metadata": junk}
        assert get_hints(body) is None and get_agent_card(body) is None
    failed = {**error("m", ErrorCodes.INTERNAL_ERROR, "no"), "metadata": meta["metadata"]}
    assert get_hints(failed) is None and get_agent_card(failed) is None


NOT_SUCCESS: dict[str, Any] = {
    "no-version": {"id": 1, "result": 1},
    "version-1": {"jsonrpc": "1.0", "id": 1, "result": 1},
    "version-number": {"jsonrpc": 2.0, "id": 1, "result": 1},
    "no-id": {"jsonrpc": "2.0", "result": 1},
    "id-float": {"jsonrpc": "2.0", "id": 1.5, "result": 1},
    "id-bool": {"jsonrpc": "2.0", "id": True, "result": 1},
    "id-object": {"jsonrpc": "2.0", "id": {}, "result": 1},
    "no-result": {"jsonrpc": "2.0", "id": 1},
    "result-and-error": {"jsonrpc": "2.0", "id": 1, "result": 1, "error": {"code": 1, "message": "m"}},
}
NOT_ERROR: dict[str, Any] = {
    "no-version": {"id": 1, "error": {"code": -32600, "message": "m"}},
    "no-id": {"jsonrpc": "2.0", "error": {"code": -32600, "message": "m"}},
    "error-string": {"jsonrpc": "2.0", "id": None, "error": "nope"},
    "code-string": {"jsonrpc": "2.0", "id": None, "error": {"code": "-32600", "message": "m"}},
    "code-bool": {"jsonrpc": "2.0", "id": None, "error": {"code": True, "message": "m"}},
    "code-float": {"jsonrpc": "2.0", "id": None, "error": {"code": -32600.0, "message": "m"}},
    "no-message": {"jsonrpc": "2.0", "id": None, "error": {"code": -32600}},
    "message-number": {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": 5}},
    "with-result": {"jsonrpc": "2.0", "id": 1, "result": 1, "error": {"code": 1, "message": "m"}},
}


@pytest.mark.parametrize("case", sorted(NOT_SUCCESS))
def test_is_success_requires_a_well_formed_success(case: str) -> None:
    body = NOT_SUCCESS[case]
    assert is_success(body) is False
    assert get_result(body) is None and get_hints(body) is None and get_agent_card(body) is None


@pytest.mark.parametrize("case", sorted(NOT_ERROR))
def test_is_error_requires_a_well_formed_error_object(case: str) -> None:
    body = NOT_ERROR[case]
    assert is_error(body) is False and get_error(body) is None


def test_optional_members_of_the_wrong_shape_read_as_none() -> None:
    body = {"jsonrpc": "2.0", "id": 1, "result": 1, "hints": ["x"], "agent_card": "card", "remaining": -1}
    assert is_success(body)
    assert get_hints(body) is None and get_agent_card(body) is None and get_remaining(body) is None
    assert get_remaining({**body, "remaining": True}) is None


# -- readers never raise -------------------------------------------------------------------------


class Boom(Exception):
    pass


class Hostile:
    """Raises from everything a careless reader might call."""

    def __eq__(self, other: object) -> bool:
        raise Boom("eq")

    def __ne__(self, other: object) -> bool:
        raise Boom("ne")

    def __hash__(self) -> int:
        raise Boom("hash")

    def __getitem__(self, key: object) -> Any:
        raise Boom("getitem")

    def __bool__(self) -> bool:
        raise Boom("bool")

    def __len__(self) -> int:
        raise Boom("len")

    def __iter__(self) -> Any:
        raise Boom("iter")

    def __getattr__(self, name: str) -> Any:
        raise Boom(name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance() asks objects for it
        raise Boom("class")


class CollidingKey:
    """A dict key whose hash is that of a member name, and whose comparison raises."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        raise Boom("eq")


class RaisingDict(dict[Any, Any]):
    """A dict that holds a valid envelope but raises on every way of reading it."""

    def _boom(self, *args: Any, **kwargs: Any) -> Any:
        raise Boom("access")

    __getitem__ = __contains__ = get = keys = items = values = __iter__ = __len__ = _boom
    __eq__ = __ne__ = _boom  # type: ignore[assignment]


class HostileStr(str):
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        raise Boom("eq")

    __hash__ = str.__hash__


class HostileInt(int):
    def __eq__(self, other: object) -> bool:
        raise Boom("eq")

    def __ge__(self, other: object) -> bool:
        raise Boom("ge")

    __hash__ = int.__hash__


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


HOSTILE: list[Any] = [
    None,
    b'{"jsonrpc":"2.0","id":1,"result":1}',
    '{"jsonrpc":"2.0","id":1,"result":1}',
    [success(1, 1)],
    (("jsonrpc", "2.0"),),
    Hostile(),
    RaisingDict(success(1, 1)),
    RaisingDict(error(1, -32600, "m")),
    {CollidingKey("jsonrpc"): "2.0", "id": 1, "result": 1},
    {"jsonrpc": "2.0", CollidingKey("id"): 1, "result": 1},
    {"jsonrpc": "2.0", "id": 1, CollidingKey("result"): 1},
    {"jsonrpc": "2.0", "id": 1, "error": {CollidingKey("code"): 1, "message": "m"}},
    {"jsonrpc": HostileStr("2.0"), "id": 1, "result": 1},
    {
        "jsonrpc": "2.0",
        "id": HostileStr("x"),
        "result": Hostile(),
        "hints": Hostile(),
        "remaining": HostileInt(1),
    },
    {"jsonrpc": "2.0", "id": HostileInt(1), "error": {"code": HostileInt(1), "message": HostileStr("m")}},
    {"jsonrpc": "2.0", "id": 1, "error": Hostile()},
    {"jsonrpc": "2.0", "id": 1, "error": RaisingDict({"code": 1, "message": "m"})},
    {"jsonrpc": Hostile(), "id": Hostile(), "result": Hostile()},
    {1: 2, (3,): 4, None: 5, 1.5: 6, frozenset(): 7},
    {"jsonrpc": "2.0", "id": 1, "result": _deep(100_000)},
    _deep(100_000),
    {"jsonrpc": "2.0", "id": 10**5000, "result": "x" * 1_000_000},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": 10**5000, "message": "m" * 1_000_000}},
    math.nan,
    object(),
    type,
    Boom,
    iter([]),
]


def _check_readers(body: Any) -> None:
    for reader in READERS:
        answer = reader(body)
        if reader in (is_success, is_error):
            assert answer is True or answer is False
    if is_success(body):
        assert get_error(body) is None
    if is_error(body):
        assert not is_success(body) and get_result(body) is None
        err = get_error(body)
        assert type(err) is dict and set(err) <= {"code", "message", "data"}


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_readers_never_raise_on_hostile_objects(index: int) -> None:
    _check_readers(HOSTILE[index])


def test_readers_read_hostile_containers_fail_closed() -> None:
    # A dict subclass is read for what it stores, whatever its methods do; a hostile key or
    # value makes the envelope not well formed.
    assert is_success(RaisingDict(success(1, 1)))
    assert is_error(RaisingDict(error(1, -32600, "m")))
    for body in [*HOSTILE[8:13], HOSTILE[15], HOSTILE[17]]:
        assert not is_success(body) and not is_error(body), body
    assert is_error(HOSTILE[16])  # the error object is a RaisingDict holding a valid one


def _junk_keys() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(["jsonrpc", "id", "result", "error", "code", "message", "data", "hints"]),
        st.sampled_from(["agent_card", "remaining"]),
        st.text(max_size=8),
        st.integers(),
        st.none(),
        st.booleans(),
        st.floats(allow_nan=False),
        st.binary(max_size=4),
        st.tuples(st.integers()),
        st.builds(CollidingKey, st.sampled_from(["jsonrpc", "id", "result", "error", "code", "message"])),
    )


def _dict_of(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    # Built here, not by st.dictionaries: a colliding key beside its twin raises on insertion.
    out: dict[Any, Any] = {}
    for key, value in pairs:
        with contextlib.suppress(Boom):
            out[key] = value
    return out


JUNK_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**53, max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.binary(),
    st.just("2.0"),
    st.sampled_from([ErrorCodes.INVALID_PARAMS, HostileStr("2.0"), HostileInt(-32600)]),
    st.builds(Hostile),
    st.builds(object),
)

JUNK = st.recursive(
    JUNK_LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.lists(st.tuples(_junk_keys(), children), max_size=6).map(_dict_of),
        st.dictionaries(st.text(max_size=8), children, max_size=4).map(RaisingDict),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=30,
)

ENVELOPE_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.one_of(st.just("2.0"), JUNK),
        "id": st.one_of(st.integers(), st.text(max_size=4), st.none(), JUNK),
        "result": JUNK,
        "error": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "code": st.one_of(st.integers(), JUNK),
                    "message": st.one_of(st.text(), JUNK),
                    "data": JUNK,
                },
            ),
            JUNK,
        ),
        "hints": JUNK,
        "agent_card": JUNK,
        "remaining": st.one_of(st.integers(), JUNK),
    },
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(JUNK, ENVELOPE_LIKE, ENVELOPE_LIKE.map(RaisingDict)))
def test_readers_never_raise(body: Any) -> None:
    _check_readers(body)


@settings(max_examples=300, deadline=None)
@given(
    rid=st.one_of(st.none(), st.integers(-(2**53) + 1, 2**53 - 1), st.text(max_size=20)),
    result=st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text()),
        lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c, max_size=3)),
        max_leaves=10,
    ),
    code=st.integers(-(2**53) + 1, 2**53 - 1),
    message=st.text(),
)
def test_what_the_builders_write_the_readers_read_back(
    rid: Any, result: Any, code: int, message: str
) -> None:
    ok = json.loads(encoding.dumps(success(rid, result)))
    assert is_success(ok) and not is_error(ok) and get_result(ok) == result
    bad = json.loads(encoding.dumps(error(rid, code, message)))
    assert is_error(bad) and not is_success(bad) and get_error(bad) == {"code": code, "message": message}


# -- the SDK writes envelopes in one place ---------------------------------------------------------


def test_no_module_but_the_helpers_writes_a_jsonrpc_envelope() -> None:
    member = re.compile(r"""["']jsonrpc["']\s*:""")
    version = re.compile(r"""["']2\.0["']""")
    writers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if member.search(text := path.read_text(encoding="utf-8")) or version.search(text)
    )
    assert writers == ["jsonrpc.py"]


# -- the optional members are additive --------------------------------------------------------------


class AddingTransport(httpx.AsyncHTTPTransport):
    """Adds ``hints`` and ``agent_card`` to every JSON reply of a real server."""

    def __init__(self) -> None:
        super().__init__()
        self.added = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        body = json.loads(await response.aread())
        body.update(hints={"next": "summarize"}, agent_card={"name": "peer"})
        self.added += 1
        return httpx.Response(response.status_code, headers=JSON, content=json.dumps(body).encode())


@asynccontextmanager
async def _client(transport: httpx.AsyncBaseTransport) -> AsyncIterator[A2AClient]:
    async with httpx.AsyncClient(transport=transport) as http, A2AClient(identity("client"), http=http) as c:
        yield c


async def test_the_sdk_client_ignores_hints_and_agent_card_in_replies() -> None:
    server = build_server()
    transport = AddingTransport()
    async with serve_app(server.app()) as url, _client(transport) as client:
        result = await client.request(server.identity.did, {"goal": "echo", "inputs": {"a": 1}}, endpoint=url)
        assert result.result == {"echo": {"a": 1}}
    assert transport.added >= 4  # hello, proof, accept_policy, intent (and the close)


async def test_a_protocol_server_refuses_metadata_in_a_request_which_is_why_request_does() -> None:
    server = build_server()
    body = request("intent", {}, 1)
    async with serve_app(server.app()) as url, httpx.AsyncClient() as http:
        for extra in ({"metadata": {"trace": "t"}}, {}):
            reply = await http.post(
                url + "/a2a/intent", content=encoding.dumps({**body, **extra}), headers=JSON
            )
            got = reply.json()
            assert is_error(got)
            assert get_error(got)["code"] == (
                ErrorCodes.INVALID_REQUEST if extra else ErrorCodes.INVALID_PARAMS
            )


def test_the_module_imports_only_the_standard_library_and_errors() -> None:
    source = (PACKAGE / "jsonrpc.py").read_text(encoding="utf-8")
    imported = set(re.findall(r"^(?:from|import) ([\w.]+)", source, flags=re.MULTILINE))
    assert imported <= {"__future__", "enum", "collections.abc", "typing", "a2a_secure.errors"}
    assert set(jsonrpc.__all__) >= {"request", "success", "error", "partial", "ErrorCodes"}
