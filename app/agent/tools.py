"""Tools: async callables with a JSON schema derived from their type hints.

A tool is registered by import path (``package.module:function``). The calls of one assistant
message form a batch: they run concurrently, each under its own timeout, and their results are
recorded in call order. A tool that raises, times out, is unknown or gets arguments that do not
fit its schema produces an ``is_error`` result: the model sees what went wrong, the run goes on.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from app import telemetry

from .messages import TextBlock, ToolCallBlock, ToolResultMessage
from .providers.base import ToolSpec

ToolFn = Callable[..., Awaitable[Any]]

#: the label of the agent's own server tools (on ``/v1`` ``mcp_call`` items, and in the
#: ``server_label`` of their calls); no MCP server may take it
BUILTIN_LABEL = "carryover"


class ToolLoadError(ValueError):
    """A tool path that cannot be imported or is not an async function."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: ToolFn
    arguments: type[BaseModel]
    timeout: float | None = None

    @property
    def spec(self) -> ToolSpec:
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)

    @classmethod
    def from_function(
        cls, fn: ToolFn, *, name: str | None = None, timeout: float | None = None
    ) -> Tool:
        """Build a tool from an ``async def`` whose parameters are type-annotated."""
        if not inspect.iscoroutinefunction(fn):
            raise ToolLoadError(f"tool {fn!r} must be an async function")
        hints = get_type_hints(fn)
        fields: dict[str, Any] = {}
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            annotation = hints.get(pname, Any)
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (annotation, default)
        tool_name = name or fn.__name__
        model = create_model(
            f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        doc = inspect.getdoc(fn) or ""
        return cls(name=tool_name, description=doc, fn=fn, arguments=model, timeout=timeout)


def load_tool(path: str, *, timeout: float | None = None) -> Tool:
    """Import ``module:attr`` and make a tool of it (an existing :class:`Tool` is kept)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ToolLoadError(f"tool path {path!r} must look like 'package.module:function'")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise ToolLoadError(f"cannot import tool {path!r}: {exc}") from None
    if isinstance(target, Tool):
        return target
    return Tool.from_function(target, timeout=timeout)


@dataclass(frozen=True)
class ToolRegistry:
    tools: dict[str, Tool] = field(default_factory=dict)
    default_timeout: float = 60.0
    _specs: tuple[ToolSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Schemas are built once: every provider request of every run sends them.
        object.__setattr__(self, "_specs", tuple(t.spec for t in self.tools.values()))

    @classmethod
    def from_paths(cls, paths: Iterable[str], *, default_timeout: float = 60.0) -> ToolRegistry:
        tools: dict[str, Tool] = {}
        for path in paths:
            tool = load_tool(path)
            if tool.name in tools:
                raise ToolLoadError(f"two tools are named {tool.name!r}")
            tools[tool.name] = tool
        return cls(tools=tools, default_timeout=default_timeout)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return self._specs

    def server_of(self, name: str) -> str | None:
        """``carryover`` for a tool of this registry (the agent's own), else None."""
        return BUILTIN_LABEL if name in self.tools else None

    async def call(self, call: ToolCallBlock) -> ToolResultMessage:
        """Run one call to completion; every failure becomes an ``is_error`` result."""
        tool = self.tools.get(call.name)
        if tool is None:
            return error_result(call, f"unknown tool {call.name!r}")
        try:
            raw = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return error_result(call, f"arguments are not valid JSON: {exc}")
        if not isinstance(raw, dict):
            return error_result(call, "arguments must be a JSON object")
        try:
            args = tool.arguments.model_validate(raw)
        except ValidationError as exc:
            return error_result(call, f"invalid arguments: {exc.errors(include_url=False)}")
        timeout = tool.timeout if tool.timeout is not None else self.default_timeout
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                value = await tool.fn(**dict(args))
            text = _render(value)
        except TimeoutError as exc:
            if deadline.expired():
                return error_result(call, f"tool {call.name!r} timed out after {timeout:g}s")
            return error_result(call, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a tool's failure is the model's information, not the run's
            return error_result(call, f"{type(exc).__name__}: {exc}")
        return ToolResultMessage(
            tool_call_id=call.id, tool_name=call.name, content=(TextBlock(text=text),)
        )


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


def error_result(call: ToolCallBlock, message: str) -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call.id,
        tool_name=call.name,
        content=(TextBlock(text=message),),
        is_error=True,
    )


def interrupted_result(call: ToolCallBlock) -> ToolResultMessage:
    """Closes a call whose run ended before it finished: its effect is unknown."""
    return error_result(
        call,
        "interrupted: the run ended before this tool call finished; it was not retried and "
        "its effect is unknown",
    )


class CallRunner(Protocol):
    """What runs one call of a batch: the agent's :class:`ToolRegistry`, or a run's tools with
    its MCP servers (:class:`app.agent.mcp.RunTools`)."""

    async def call(self, call: ToolCallBlock) -> ToolResultMessage: ...

    def server_of(self, name: str) -> str | None: ...


async def run_batch(
    runner: CallRunner,
    calls: Sequence[ToolCallBlock],
    on_done: Callable[[int, ToolResultMessage], Awaitable[None]],
) -> list[ToolResultMessage]:
    """Run a batch concurrently; ``on_done`` sees each result as it completes. Each call is one
    ``execute_tool`` span (naming its MCP server, for a remote tool).

    If the task is cancelled, the unfinished calls are cancelled too and the cancellation
    propagates; results delivered through ``on_done`` before that stay with the caller.
    """
    results: list[ToolResultMessage | None] = [None] * len(calls)

    async def one(i: int, call: ToolCallBlock) -> None:
        with telemetry.tool_span(call.name, call.id, runner.server_of(call.name)) as span:
            result = await runner.call(call)
            telemetry.record_tool_result(span, result.is_error)
        results[i] = result
        await on_done(i, result)

    async with asyncio.TaskGroup() as group:
        for i, call in enumerate(calls):
            group.create_task(one(i, call))
    return [r for r in results if r is not None]
