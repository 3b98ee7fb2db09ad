"""A run's events as OpenAI's Responses streaming events (docs/openai.md, "Streaming").

:class:`EventTranslator` reads the native events of a run (the ``delta`` and ``message`` events
of :func:`app.service.events.event_payload`) and writes the sequence the official clients
check: ``response.created``, ``response.in_progress``; per output item
``response.output_item.added`` before any of its content, ``response.content_part.added``
before its ``response.output_text.delta`` events, then the ``….done`` events; last
``response.completed`` (or ``response.failed``). Every event has ``type`` and
``sequence_number``, consecutive from 0. Items carry the ids they have when read back
(:mod:`app.api.v1.items`): a message's place in its run is counted as its events arrive.

With an output schema (structured outputs) an answer's text is not streamed as it comes: its
message item is sent whole once the answer is complete, and only when it matches the schema,
as the response's ``output`` has it (:func:`~app.api.v1.views.response_object`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.agent.codec import load_message
from app.agent.messages import AssistantMessage, ToolCallBlock, ToolResultMessage
from app.agent.structured import violation

from .items import calls_by_item, item_id, items_of
from .mcp_items import CALL_PREFIX, Approved, call_item
from .views import output_text


@dataclass
class _Open:
    """An output item streamed so far: its index, the item as added, its parts' texts."""

    output_index: int
    item: dict[str, Any]
    texts: list[str] = field(default_factory=list)


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class EventTranslator:
    """Native run events in, OpenAI stream events out (as dicts, numbered)."""

    def __init__(
        self,
        run_id: str,
        skeleton: dict[str, Any],
        schema: dict[str, Any] | None = None,
        *,
        client_names: Collection[str] = (),
        approved: Mapping[str, Approved] | None = None,
    ) -> None:
        self.run_id = run_id
        self.schema = schema  # the run's output schema: messages held until they match
        self.skeleton = skeleton  # the response as created: status in_progress, no output
        #: the run's client tools: their calls' arguments stream as they come (a call to any
        #: other tool may be a server's, shown once its attempt is complete)
        self.client_names = frozenset(client_names)
        self.approved = dict(approved or {})  # calls the response's approvals answered
        self.seq = 0
        self.outputs = 0  # output items added so far
        self.index = 0  # the run's new messages seen so far
        self.made: set[str] = set()  # calls the model made in this run
        self.emitted: set[str] = set()  # the ids of the items added so far
        #: server calls of this run waiting for their result: call id → (item id, call)
        self.waiting: dict[str, tuple[str, ToolCallBlock]] = {}
        self._blocks: dict[int, tuple[_Open, int]] = {}  # block index → (item, content index)
        self._opened: list[_Open] = []  # this attempt's items, in block order
        self._last_text: _Open | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self.skeleton),
            self._event("response.in_progress", response=self.skeleton),
        ]

    def _add(self, item: dict[str, Any]) -> tuple[_Open, dict[str, Any]]:
        opened = _Open(self.outputs, item)
        self.outputs += 1
        self.emitted.add(str(item.get("id")))
        self._opened.append(opened)
        return opened, self._event(
            "response.output_item.added", output_index=opened.output_index, item=item
        )

    def on(self, name: str, data: Any) -> list[dict[str, Any]]:
        """The OpenAI events for one native event (often none)."""
        if name == "delta" and isinstance(data, dict):
            return self._delta(data)
        if name == "message" and isinstance(data, str):  # as it is stored (a live run's)
            data = json.loads(data)
        if name == "message" and isinstance(data, dict):
            return self._message(data)
        return []

    def _delta(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        kind, block = data.get("kind"), int(data.get("index", 0))
        out: list[dict[str, Any]] = []
        k = len(self._opened)
        if kind == "text" and self.schema is not None:
            return []  # sent whole with its message, if it matches the schema
        if kind == "text":
            if block not in self._blocks:
                text = self._last_text
                if text is None:
                    item = {
                        "type": "message",
                        "id": item_id("msg", self.run_id, self.index, k),
                        "role": "assistant",
                        "status": "in_progress",
                        "content": [],
                    }
                    text, added = self._add(item)
                    out.append(added)
                    self._last_text = text
                part = len(text.texts)
                text.texts.append("")
                self._blocks[block] = (text, part)
                out.append(
                    self._event(
                        "response.content_part.added",
                        item_id=text.item["id"],
                        output_index=text.output_index,
                        content_index=part,
                        part={"type": "output_text", "text": "", "annotations": []},
                    )
                )
            text, part = self._blocks[block]
            text.texts[part] += str(data.get("text", ""))
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=text.item["id"],
                    output_index=text.output_index,
                    content_index=part,
                    delta=str(data.get("text", "")),
                    logprobs=[],
                )
            )
            return out
        self._last_text = None
        if kind == "tool_call" and str(data.get("name", "")) not in self.client_names:
            return []  # perhaps a server's call: shown once the attempt is complete
        if kind == "tool_call":
            item = {
                "type": "function_call",
                "id": item_id("fc", self.run_id, self.index, k),
                "call_id": str(data.get("id", "")),
                "name": str(data.get("name", "")),
                "arguments": "",
                "status": "in_progress",
            }
            opened, added = self._add(item)
            self._blocks[block] = (opened, 0)
            opened.texts.append("")
            return [added]
        if kind == "tool_call_arguments" and block in self._blocks:
            opened, _ = self._blocks[block]
            opened.texts[0] += str(data.get("text", ""))
            return [
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=opened.item["id"],
                    output_index=opened.output_index,
                    delta=str(data.get("text", "")),
                )
            ]
        if kind == "thinking" and block not in self._blocks:
            item = {
                "type": "reasoning",
                "id": item_id("rs", self.run_id, self.index, k),
                "summary": [],
                "status": "in_progress",
            }
            opened, added = self._add(item)
            self._blocks[block] = (opened, 0)
            return [added]
        return []

    def _message(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        message = load_message(data)
        index = self.index
        self.index += 1
        out: list[dict[str, Any]] = []
        if isinstance(message, AssistantMessage):
            opened = {o.item["id"]: o for o in self._opened}
            self._blocks, self._opened, self._last_text = {}, [], None
            if not message.replayable:  # a failed attempt: close what it streamed
                for o in opened.values():
                    out.extend(self._done(o, {**o.item, "status": "incomplete"}))
                return out
            self.made.update(c.id for c in message.tool_calls)
            served = calls_by_item(message, self.run_id, index)
            for item in items_of(message, self.run_id, index):
                if not self._shown(item):
                    continue
                if item["type"] == "mcp_call":  # added with its result
                    call = served[item["id"]]
                    self.waiting[call.id] = (item["id"], call)
                    continue
                found = opened.pop(item["id"], None)
                if found is None:
                    found, added = self._add({**_empty(item), "status": "in_progress"})
                    self._opened.clear()
                    out.append(added)
                out.extend(self._done(found, item))
            for o in opened.values():  # streamed, then not in the message (should not happen)
                out.extend(self._done(o, {**o.item, "status": "incomplete"}))
            return out
        if isinstance(message, ToolResultMessage):
            call_id = message.tool_call_id
            if call_id in self.waiting:
                item_id_, call = self.waiting.pop(call_id)
                return self._server_call(call_item(call, item_id_, message))
            if call_id in self.approved:
                approved = self.approved[call_id]
                item_id_ = item_id(CALL_PREFIX, self.run_id, index, 0)
                item = call_item(approved.call, item_id_, message, approved.approval_request_id)
                return self._server_call(item)
        if isinstance(message, ToolResultMessage) and message.tool_call_id in self.made:
            for item in items_of(message, self.run_id, index):
                found, added = self._add({**item, "status": "in_progress"})
                self._opened.clear()
                out.append(added)
                out.extend(self._done(found, item))
        return out

    def _server_call(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """A server-executed call, added whole once its result is in, as OpenAI streams an
        ``mcp_call``: added, its arguments, in progress, completed (or failed), done."""
        opened, added = self._add({**item, "output": None, "error": None, "status": "in_progress"})
        self._opened.clear()
        where = {"item_id": item["id"], "output_index": opened.output_index}
        ended = (
            "response.mcp_call.failed"
            if item["status"] == "failed"
            else ("response.mcp_call.completed")
        )
        return [
            added,
            self._event("response.mcp_call_arguments.delta", **where, delta=item["arguments"]),
            self._event("response.mcp_call_arguments.done", **where, arguments=item["arguments"]),
            self._event("response.mcp_call.in_progress", **where),
            self._event(ended, **where),
            self._event("response.output_item.done", output_index=opened.output_index, item=item),
        ]

    def _shown(self, item: dict[str, Any]) -> bool:
        """Is the item presented? Not a message that does not match the run's schema."""
        if self.schema is None or item["type"] != "message":
            return True
        return violation(self.schema, output_text([item])) is None

    def _done(self, opened: _Open, item: dict[str, Any]) -> list[dict[str, Any]]:
        """The ``….done`` events of an item (its content first, when it was not streamed)."""
        out: list[dict[str, Any]] = []
        where = {"item_id": item["id"], "output_index": opened.output_index}
        if item["type"] == "message":
            parts = item.get("content") or [
                {"type": "output_text", "text": t, "annotations": []} for t in opened.texts
            ]
            for j, part in enumerate(parts):
                if j >= len(opened.texts):  # not streamed: its part and text now
                    out.append(
                        self._event(
                            "response.content_part.added",
                            **where,
                            content_index=j,
                            part={**part, "text": ""},
                        )
                    )
                    out.append(
                        self._event(
                            "response.output_text.delta",
                            **where,
                            content_index=j,
                            delta=part["text"],
                            logprobs=[],
                        )
                    )
                out.append(
                    self._event(
                        "response.output_text.done",
                        **where,
                        content_index=j,
                        text=part["text"],
                        logprobs=[],
                    )
                )
                out.append(
                    self._event("response.content_part.done", **where, content_index=j, part=part)
                )
            item = {**item, "content": parts}
        elif item["type"] == "function_call":
            if not opened.texts:
                out.append(
                    self._event(
                        "response.function_call_arguments.delta", **where, delta=item["arguments"]
                    )
                )
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item.get("name"),
                    arguments=item.get("arguments", "".join(opened.texts)),
                )
            )
        out.append(
            self._event("response.output_item.done", output_index=opened.output_index, item=item)
        )
        return out

    def finish(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The last events: the response's output items that were not streamed (calls awaiting
        an approval, server calls the run ended before), then ``response.completed`` (or
        ``…incomplete`` / ``…failed``)."""
        out: list[dict[str, Any]] = []
        for item in response.get("output") or ():
            if str(item.get("id")) in self.emitted:
                continue
            opened, added = self._add(item)
            self._opened.clear()
            out.append(added)
            out.append(
                self._event(
                    "response.output_item.done", output_index=opened.output_index, item=item
                )
            )
        kind = {
            "completed": "response.completed",
            "incomplete": "response.incomplete",
        }.get(response["status"], "response.failed")
        return [*out, self._event(kind, response=response)]


def _empty(item: dict[str, Any]) -> dict[str, Any]:
    """An item as added before its content streams."""
    if item["type"] == "message":
        return {**item, "content": []}
    if item["type"] == "function_call":
        return {**item, "arguments": ""}
    return item


__all__ = ["EventTranslator", "sse"]
