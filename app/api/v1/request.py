"""What a ``/v1/responses`` request asks of its run, beside its input: its tools (client tools
and MCP servers, each with its place), its settings (``temperature``, ``max_output_tokens``,
``text.format``), and what its run keeps of it to answer it later (never an MCP tool's
headers). Used by :mod:`app.api.v1.answers` and the responses route."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.agent.mcp import McpServer
from app.agent.messages import ToolCallBlock
from app.agent.pending import ClientTool
from app.agent.records import RunSettings
from app.agent.structured import OutputSchema, schema_problem
from app.config import Settings
from app.service.runs import RunRequest

from ..tools import McpTool as McpToolBody
from .errors import bad_request
from .mcp_items import Approved
from .schemas import McpTool, ResponseCreate


@dataclass(frozen=True)
class RunTools:
    """A response's ``tools`` as a run's: its client tools and MCP servers, with their places."""

    client: tuple[ClientTool, ...]
    client_at: tuple[int, ...]
    servers: tuple[McpServer, ...]
    servers_at: tuple[int, ...]

    def request(self, **fields: Any) -> RunRequest:
        return RunRequest(
            client_tools=self.client,
            tool_positions=self.client_at,
            mcp_servers=self.servers,
            mcp_positions=self.servers_at,
            **fields,
        )


def run_tools(body: ResponseCreate, settings: Settings) -> RunTools:
    client: list[ClientTool] = []
    client_at: list[int] = []
    servers: list[McpServer] = []
    servers_at: list[int] = []
    for i, tool in enumerate(body.tools):
        if isinstance(tool, McpTool):
            servers.append(tool.server(settings))
            servers_at.append(i)
        else:
            parameters = tool.parameters or {"type": "object", "properties": {}}
            client.append(
                ClientTool(
                    name=tool.name, description=tool.description or "", parameters=parameters
                )
            )
            client_at.append(i)
    return RunTools(tuple(client), tuple(client_at), tuple(servers), tuple(servers_at))


def run_settings(body: ResponseCreate) -> RunSettings:
    """A response's own settings: ``temperature``, ``max_output_tokens`` and ``text.format``
    (a ``json_schema`` format is the run's output schema; 400 for one that is not valid)."""
    return RunSettings(
        temperature=body.temperature,
        max_output_tokens=body.max_output_tokens,
        output_schema=output_schema(body),
    )


def output_schema(body: ResponseCreate) -> OutputSchema | None:
    found = (body.text or {}).get("format")
    if found is None:
        return None
    if not isinstance(found, dict) or found.get("type") not in ("text", "json_schema"):
        raise bad_request(
            'Invalid value for \'text.format\': give {"type": "text"} or '
            '{"type": "json_schema", "name", "schema", "strict"}.',
            "text.format",
        )
    if found["type"] == "text":
        return None
    name, schema, strict = found.get("name"), found.get("schema"), found.get("strict")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise bad_request("Invalid value for 'text.format.name'.", "text.format.name")
    problem = schema_problem(schema)
    if problem is not None:
        raise bad_request(f"Invalid schema for 'text.format.schema': {problem}.", "text.format")
    assert isinstance(schema, dict)
    return OutputSchema(name, schema, strict is not False)


def text_field(body: ResponseCreate) -> dict[str, Any]:
    """The response's ``text`` as it is answered (the format as given; text by default)."""
    found = (body.text or {}).get("format")
    return {"format": found if isinstance(found, dict) else {"type": "text"}}


def kept_fields(body: ResponseCreate) -> dict[str, Any]:
    """What a stored response keeps of its request, with its run (``RunRequest.response``):
    never an MCP tool's headers. ``approvals``: the calls its ``mcp_approval_response`` items
    answered, so its output shows them as ``mcp_call`` items."""
    kept = {
        "text": text_field(body),
        "temperature": body.temperature,
        "max_output_tokens": body.max_output_tokens,
        "instructions": body.instructions,
        "tools": tools_echo(body),
        "metadata": body.metadata or {},
        "previous_response_id": body.previous_response_id,
        "background": body.background,
    }
    if body.approved:
        kept["approvals"] = list(body.approved)
    return kept


def tools_echo(body: ResponseCreate) -> list[dict[str, Any]]:
    """The request's tools as a response shows them (an MCP tool without its headers)."""
    return [
        t.echo() if isinstance(t, McpToolBody) else t.model_dump(exclude_none=True)
        for t in body.tools
    ]


def approved_calls(kept: Mapping[str, Any]) -> dict[str, Approved]:
    """The calls a response's approvals answered, from what its run kept."""
    out: dict[str, Approved] = {}
    for entry in kept.get("approvals") or ():
        try:
            call = ToolCallBlock.model_validate(entry["call"])
        except (KeyError, TypeError, ValueError):
            continue
        out[call.id] = Approved(entry.get("approval_request_id"), call)
    return out


def client_names(kept: Mapping[str, Any]) -> frozenset[str]:
    """The names of a response's function tools (their calls stream as they come)."""
    return frozenset(
        str(t.get("name"))
        for t in kept.get("tools") or ()
        if isinstance(t, Mapping) and t.get("type") == "function"
    )


def pending_servers(required: Any) -> frozenset[str]:
    """The calls of a ``required_action`` (a value, or as a record stores it) that a server
    runs once approved: shown as ``mcp_approval_request`` items."""
    if required is None:
        return frozenset()
    calls = required.get("tool_calls") if isinstance(required, Mapping) else required.tool_calls
    found = set()
    for call in calls or ():
        label = call.get("server_label") if isinstance(call, Mapping) else call.server_label
        if label is not None:
            found.add(str(call["id"] if isinstance(call, Mapping) else call.id))
    return frozenset(found)


__all__ = [
    "RunTools",
    "approved_calls",
    "client_names",
    "kept_fields",
    "output_schema",
    "pending_servers",
    "run_settings",
    "run_tools",
    "text_field",
    "tools_echo",
]
