"""contract §2 — tools: schemas from type hints, loading by import path, calls that never raise,
and batches that run concurrently with results in call order.

Concurrency is proven with events, never with wall-clock timings: tools that each wait for the
other would deadlock if run one after the other, and a generous ``asyncio.timeout`` turns such a
deadlock into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from pydantic import BaseModel

from app.agent import builtin_tools
from app.agent.messages import TextBlock, ToolCallBlock, ToolResultMessage
from app.agent.tools import (
    Tool,
    ToolLoadError,
    ToolRegistry,
    error_result,
    interrupted_result,
    load_tool,
    run_batch,
)

from . import strategies as s

GUARD = 10.0  # seconds; only bounds a deadlock, never asserted on


def call(name: str, arguments: str = "{}", id_: str | None = None) -> ToolCallBlock:
    return ToolCallBlock(id=id_ or f"call_{name}", name=name, arguments=arguments)


def text(result: ToolResultMessage) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


def builtin_registry(**kwargs: Any) -> ToolRegistry:
    return ToolRegistry.from_paths(
        [
            "app.agent.builtin_tools:time_now",
            "app.agent.builtin_tools:wait",
            "app.agent.builtin_tools:fail",
        ],
        **kwargs,
    )


# --- schemas from type hints ----------------------------------------------------------------------


class Point(BaseModel):
    x: int
    y: int


async def sample(
    query: str,
    limit: int,
    ratio: float = 0.5,
    exact: bool = False,
    tags: list[str] | None = None,
    mode: Literal["fast", "slow"] = "fast",
    where: Point | None = None,
    anything=None,
    *args: Any,
    **kwargs: Any,
) -> str:
    """Search for things.

    More detail here."""
    return "ok"


def test_schema_from_type_hints() -> None:
    tool = Tool.from_function(sample)
    assert tool.name == "sample"
    assert tool.description == "Search for things.\n\nMore detail here."
    spec = tool.spec
    assert spec.name == "sample"
    assert spec.description == tool.description
    schema = spec.parameters
    assert "title" not in schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["query", "limit"]
    props = schema["properties"]
    assert set(props) == {"query", "limit", "ratio", "exact", "tags", "mode", "where", "anything"}
    assert props["query"]["type"] == "string"
    assert props["limit"]["type"] == "integer"
    assert props["ratio"]["type"] == "number"
    assert props["ratio"]["default"] == 0.5
    assert props["exact"]["type"] == "boolean"
    assert props["exact"]["default"] is False
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert {"type": "null"} in props["tags"]["anyOf"]
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["mode"]["default"] == "fast"
    assert props["anything"]["default"] is None
    assert "type" not in props["anything"]  # unannotated: any JSON value
    json.dumps(schema)  # the schema is plain JSON


def test_schema_of_a_tool_without_parameters() -> None:
    spec = Tool.from_function(builtin_tools.time_now).spec
    assert spec.parameters["properties"] == {}
    assert spec.parameters.get("required", []) == []


def test_builtin_wait_schema_requires_seconds() -> None:
    params = Tool.from_function(builtin_tools.wait).spec.parameters
    assert params["required"] == ["seconds"]
    assert params["properties"]["seconds"]["type"] == "number"


def test_from_function_name_and_timeout_overrides() -> None:
    tool = Tool.from_function(sample, name="search", timeout=2.5)
    assert tool.name == "search"
    assert tool.spec.name == "search"
    assert tool.timeout == 2.5


def test_from_function_refuses_sync_functions() -> None:
    def sync(x: int) -> int:
        return x

    with pytest.raises(ToolLoadError):
        Tool.from_function(sync)  # type: ignore[arg-type]
    with pytest.raises(ToolLoadError):
        Tool.from_function(lambda: None)  # type: ignore[arg-type]


# --- loading by import path -----------------------------------------------------------------------


def test_load_tool_by_import_path() -> None:
    tool = load_tool("app.agent.builtin_tools:wait")
    assert tool.name == "wait"
    assert tool.fn is builtin_tools.wait
    assert tool.timeout is None
    assert load_tool("app.agent.builtin_tools:fail", timeout=3).timeout == 3


PREBUILT = Tool.from_function(builtin_tools.time_now, name="clock")


def test_load_tool_keeps_an_existing_tool() -> None:
    assert load_tool(f"{__name__}:PREBUILT") is PREBUILT


@pytest.mark.parametrize(
    "path",
    [
        "",
        "app.agent.builtin_tools",  # no attribute
        "app.agent.builtin_tools:",
        ":wait",
        "no_such_module_xyz:wait",
        "app.agent.no_such_module:wait",
        "app.agent.builtin_tools:no_such_tool",
        "os:path.join",  # dotted attribute
        "app.agent.builtin_tools:asyncio",  # a module, not a function
        "app.agent.builtin_tools:UTC",  # not callable
        "json:dumps",  # sync function
        "app.agent.tools:ToolRegistry",  # a class
    ],
)
def test_bad_tool_paths_raise_tool_load_error(path: str) -> None:
    with pytest.raises(ToolLoadError):
        load_tool(path)


def test_registry_from_paths() -> None:
    registry = builtin_registry(default_timeout=5)
    assert set(registry.tools) == {"time_now", "wait", "fail"}
    assert registry.default_timeout == 5
    assert [spec.name for spec in registry.specs] == ["time_now", "wait", "fail"]


def test_registry_refuses_two_tools_with_one_name() -> None:
    with pytest.raises(ToolLoadError):
        ToolRegistry.from_paths(["app.agent.builtin_tools:wait", "app.agent.builtin_tools:wait"])


def test_registry_refuses_a_bad_path() -> None:
    with pytest.raises(ToolLoadError):
        ToolRegistry.from_paths(["app.agent.builtin_tools:wait", "json:loads"])


# --- ToolRegistry.call ----------------------------------------------------------------------------


async def test_call_with_valid_arguments() -> None:
    registry = builtin_registry()
    result = await registry.call(call("wait", '{"seconds": 0}', id_="c-1"))
    assert result.tool_call_id == "c-1"
    assert result.tool_name == "wait"
    assert result.is_error is False
    assert text(result) == "waited 0 seconds"


@pytest.mark.parametrize("arguments", ["", "   ", "{}", " { } \n"])
async def test_call_with_empty_arguments(arguments: str) -> None:
    result = await builtin_registry().call(call("time_now", arguments))
    assert result.is_error is False
    assert datetime.fromisoformat(text(result)).tzinfo is not None


async def test_return_values_are_rendered_as_text() -> None:
    async def as_dict(n: int) -> dict[str, Any]:
        return {"n": n, "s": "é"}

    async def as_model() -> Point:
        return Point(x=1, y=2)

    async def as_none() -> None:
        return None

    registry = ToolRegistry(
        {t.name: t for t in map(Tool.from_function, (as_dict, as_model, as_none))}
    )
    assert json.loads(text(await registry.call(call("as_dict", '{"n": 3}')))) == {"n": 3, "s": "é"}
    assert json.loads(text(await registry.call(call("as_model")))) == {"x": 1, "y": 2}
    assert text(await registry.call(call("as_none"))) == "null"


async def test_nested_model_arguments_are_validated() -> None:
    seen: list[Any] = []

    async def move(to: Point) -> str:
        seen.append(to)
        return "moved"

    registry = ToolRegistry({"move": Tool.from_function(move)})
    ok = await registry.call(call("move", '{"to": {"x": 1, "y": 2}}'))
    assert ok.is_error is False
    assert seen == [Point(x=1, y=2)]
    bad = await registry.call(call("move", '{"to": {"x": 1}}'))
    assert bad.is_error is True
    assert "y" in text(bad)


async def test_unknown_tool_is_an_error_result() -> None:
    result = await builtin_registry().call(call("rm_rf", "{}", id_="c9"))
    assert result.is_error is True
    assert result.tool_call_id == "c9"
    assert result.tool_name == "rm_rf"
    assert "unknown tool 'rm_rf'" in text(result)


@pytest.mark.parametrize(
    "arguments",
    ["{", "{'seconds': 1}", '{"seconds": 1} x', "not json", '{"seconds": NaN'],
)
async def test_invalid_json_arguments_are_an_error_result(arguments: str) -> None:
    result = await builtin_registry().call(call("wait", arguments))
    assert result.is_error is True
    assert "not valid JSON" in text(result)


@pytest.mark.parametrize("arguments", ["[]", "[1]", "1", '"x"', "null", "true"])
async def test_non_object_arguments_are_an_error_result(arguments: str) -> None:
    result = await builtin_registry().call(call("wait", arguments))
    assert result.is_error is True
    assert "JSON object" in text(result)


@pytest.mark.parametrize(
    "arguments",
    [
        "{}",
        '{"seconds": "soon"}',
        '{"seconds": 1, "extra": true}',
        '{"secs": 1}',
        '{"seconds": [1]}',
        '{"seconds": null}',
    ],
)
async def test_schema_mismatch_is_an_error_result(arguments: str) -> None:
    result = await builtin_registry().call(call("wait", arguments))
    assert result.is_error is True
    assert "invalid arguments" in text(result)


async def test_raising_tool_is_an_error_result_with_the_message() -> None:
    registry = builtin_registry()
    result = await registry.call(call("fail", '{"reason": "disk on fire \U0001f525"}'))
    assert result.is_error is True
    assert result.tool_name == "fail"
    assert "RuntimeError" in text(result)
    assert "disk on fire \U0001f525" in text(result)
    default = await registry.call(call("fail", ""))
    assert default.is_error is True
    assert "requested failure" in text(default)


async def test_timeout_is_an_error_result() -> None:
    never = asyncio.Event()
    cancelled = asyncio.Event()

    async def hang() -> str:
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    for registry in (
        ToolRegistry({"hang": Tool.from_function(hang, timeout=0.01)}),
        ToolRegistry({"hang": Tool.from_function(hang)}, default_timeout=0.01),
    ):
        cancelled.clear()
        async with asyncio.timeout(GUARD):
            result = await registry.call(call("hang"))
        assert result.is_error is True
        assert "timed out" in text(result)
        assert cancelled.is_set()  # the tool itself was cancelled, not left running


async def test_builtin_wait_times_out() -> None:
    registry = builtin_registry(default_timeout=0.01)
    async with asyncio.timeout(GUARD):
        result = await registry.call(call("wait", '{"seconds": 3600}'))
    assert result.is_error is True
    assert "timed out" in text(result)


async def _echo(value: str = "") -> str:
    return value


@settings(max_examples=150)
@given(s.raw_arguments(), s.tool_call_ids())
def test_call_never_raises_on_any_raw_arguments(arguments: str, call_id: str) -> None:
    registry = ToolRegistry({"echo": Tool.from_function(_echo)})
    result = asyncio.run(registry.call(ToolCallBlock(id=call_id, name="echo", arguments=arguments)))
    assert result.tool_call_id == call_id
    assert result.tool_name == "echo"
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        parsed = None
    fits = (
        isinstance(parsed, dict)
        and set(parsed) <= {"value"}
        and isinstance(parsed.get("value", ""), str)
    )
    assert result.is_error is (not fits)
    if fits:
        assert text(result) == parsed.get("value", "")


def test_error_and_interrupted_results() -> None:
    c = call("wait", id_="z")
    err = error_result(c, "nope")
    assert (err.tool_call_id, err.tool_name, err.is_error, text(err)) == ("z", "wait", True, "nope")
    interrupted = interrupted_result(c)
    assert interrupted.is_error is True
    assert interrupted.tool_call_id == "z"
    assert "interrupted" in text(interrupted)


# --- run_batch ------------------------------------------------------------------------------------


async def test_batch_runs_calls_concurrently() -> None:
    """Each tool waits for the other to have started: run one after the other, they deadlock."""
    ping_started = asyncio.Event()
    pong_started = asyncio.Event()

    async def ping() -> str:
        ping_started.set()
        await pong_started.wait()
        return "ping"

    async def pong() -> str:
        pong_started.set()
        await ping_started.wait()
        return "pong"

    registry = ToolRegistry(
        {t.name: t for t in map(Tool.from_function, (ping, pong))}, default_timeout=GUARD * 2
    )
    async with asyncio.timeout(GUARD):
        results = await run_batch(registry, [call("ping"), call("pong")], _ignore)
    assert [text(r) for r in results] == ["ping", "pong"]
    assert all(not r.is_error for r in results)


async def test_batch_of_many_calls_all_run_at_once() -> None:
    n = 8
    barrier_count = 0
    all_in = asyncio.Event()

    async def meet(i: int) -> str:
        nonlocal barrier_count
        barrier_count += 1
        if barrier_count == n:
            all_in.set()
        await all_in.wait()
        return str(i)

    registry = ToolRegistry({"meet": Tool.from_function(meet)}, default_timeout=GUARD * 2)
    calls = [call("meet", json.dumps({"i": i}), id_=f"c{i}") for i in range(n)]
    async with asyncio.timeout(GUARD):
        results = await run_batch(registry, calls, _ignore)
    assert [r.tool_call_id for r in results] == [f"c{i}" for i in range(n)]
    assert [text(r) for r in results] == [str(i) for i in range(n)]


async def test_results_are_in_call_order_when_finishing_in_reverse() -> None:
    """Call k may only finish after call k+1 finished: completion order is the reverse."""
    n = 4
    finished = [asyncio.Event() for _ in range(n)]

    async def step(k: int) -> str:
        if k + 1 < n:
            await finished[k + 1].wait()
        finished[k].set()
        return f"done {k}"

    completion: list[int] = []

    async def on_done(i: int, result: ToolResultMessage) -> None:
        assert result.tool_call_id == f"c{i}"
        completion.append(i)

    registry = ToolRegistry({"step": Tool.from_function(step)}, default_timeout=GUARD * 2)
    calls = [call("step", json.dumps({"k": k}), id_=f"c{k}") for k in range(n)]
    async with asyncio.timeout(GUARD):
        results = await run_batch(registry, calls, on_done)
    assert completion == list(reversed(range(n)))
    assert [r.tool_call_id for r in results] == [f"c{k}" for k in range(n)]
    assert [text(r) for r in results] == [f"done {k}" for k in range(n)]


async def test_batch_turns_every_failure_into_an_error_result_in_order() -> None:
    release = asyncio.Event()

    async def slow_ok() -> str:
        await release.wait()
        return "fine"

    async def quick_fail() -> str:
        release.set()
        raise ValueError("bad input")

    tools = [
        Tool.from_function(slow_ok),
        Tool.from_function(quick_fail),
        load_tool("app.agent.builtin_tools:fail"),
    ]
    registry = ToolRegistry({t.name: t for t in tools}, default_timeout=GUARD * 2)
    batch = [
        call("slow_ok", id_="a"),
        call("quick_fail", id_="b"),
        call("missing", id_="c"),
        call("fail", '{"reason": "x"}', id_="d"),
        call("slow_ok", "{oops", id_="e"),
    ]
    delivered: dict[int, ToolResultMessage] = {}

    async def on_done(i: int, result: ToolResultMessage) -> None:
        delivered[i] = result

    async with asyncio.timeout(GUARD):
        results = await run_batch(registry, batch, on_done)
    assert [r.tool_call_id for r in results] == ["a", "b", "c", "d", "e"]
    assert [r.is_error for r in results] == [False, True, True, True, True]
    assert text(results[0]) == "fine"
    assert "ValueError: bad input" in text(results[1])
    assert "unknown tool" in text(results[2])
    assert "RuntimeError: x" in text(results[3])
    assert "not valid JSON" in text(results[4])
    assert [delivered[i] for i in range(len(batch))] == results


async def test_empty_batch() -> None:
    assert await run_batch(builtin_registry(), [], _ignore) == []


async def test_cancelling_a_batch_cancels_its_calls() -> None:
    started = [asyncio.Event(), asyncio.Event()]
    cancelled = [asyncio.Event(), asyncio.Event()]
    finished = asyncio.Event()

    async def block(k: int) -> str:
        started[k].set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled[k].set()
            raise
        return "never"

    async def quick() -> str:
        return "quick"

    delivered: list[int] = []

    async def on_done(i: int, result: ToolResultMessage) -> None:
        delivered.append(i)
        finished.set()

    registry = ToolRegistry(
        {t.name: t for t in map(Tool.from_function, (block, quick))}, default_timeout=GUARD * 2
    )
    batch = [
        call("block", '{"k": 0}', id_="a"),
        call("quick", id_="q"),
        call("block", '{"k": 1}', id_="b"),
    ]
    async with asyncio.timeout(GUARD):
        task = asyncio.create_task(run_batch(registry, batch, on_done))
        for event in (*started, finished):
            await event.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert delivered == [1]  # the finished call was delivered before the cancellation
    assert all(event.is_set() for event in cancelled)


async def _ignore(i: int, result: ToolResultMessage) -> None:
    return None


# --- defects found earlier, fixed: kept as regression tests ---------------------------------------


@pytest.mark.parametrize("path", [".builtin_tools:wait", "..x:y"])
def test_relative_module_path_raises_tool_load_error(path: str) -> None:
    with pytest.raises(ToolLoadError):
        load_tool(path)


@pytest.mark.parametrize("kind", ["tuple_keys", "circular"])
async def test_unrenderable_return_value_is_an_error_result(kind: str) -> None:
    async def weird() -> Any:
        if kind == "tuple_keys":
            return {(1, 2): "x"}
        loop: dict[str, Any] = {}
        loop["self"] = loop
        return loop

    registry = ToolRegistry({"weird": Tool.from_function(weird)})
    result = await registry.call(call("weird"))
    assert result.is_error is True
