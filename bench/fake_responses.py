"""A fast fake of OpenAI's Responses endpoint (uvicorn + starlette), streaming or not, answering at
once, for bench/provider_cost.py's ``openai-responses`` modes: what Carryover adds in front of a
stateless Responses provider, and how that grows with the history.

    fake_responses.py PORT

``POST /v1/responses`` answers a reasoning item (with its ``encrypted_content``, as a request
with ``include: ["reasoning.encrypted_content"]`` gets) and the text ``ok: N items``, as SSE
events when the request has ``stream: true`` (``response.created``, the two items' added / delta
/ done events, ``response.completed``), else as one response object. It checks nothing of the
request: tests/fakes/openai_responses_fake.py is the strict one. Like shared/bench/fake_openai.py:
127.0.0.1 only.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_ids = itertools.count(1)


def _response(body: dict[str, Any]) -> dict[str, Any]:
    n = len(body.get("input") or [])
    k = next(_ids)
    reasoning = {
        "id": f"rs_fast{k}",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Answer at once."}],
        "encrypted_content": "gAAAAB" + "x" * 600,  # about the size of a short real one
    }
    message = {
        "id": f"msg_fast{k}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "annotations": [], "text": f"ok: {n} items"}],
    }
    return {
        "id": f"resp_fast{k}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model", "m"),
        "output": [reasoning, message],
        "usage": {
            "input_tokens": 10 * n,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 16},
            "total_tokens": 10 * n + 20,
        },
    }


def _events(response: dict[str, Any]) -> str:
    seq = itertools.count()
    reasoning, message = response["output"]
    text = message["content"][0]["text"]

    def ev(kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(seq), **fields}
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    where = {"item_id": message["id"], "output_index": 1, "content_index": 0}
    return (
        ev("response.created", response=opening)
        + ev("response.output_item.added", output_index=0, item={**reasoning, "summary": []})
        + ev(
            "response.reasoning_summary_text.delta",
            item_id=reasoning["id"],
            output_index=0,
            summary_index=0,
            delta=reasoning["summary"][0]["text"],
        )
        + ev("response.output_item.done", output_index=0, item=reasoning)
        + ev("response.output_item.added", output_index=1, item={**message, "content": []})
        + ev("response.content_part.added", **where, part={"type": "output_text", "text": ""})
        + ev("response.output_text.delta", **where, delta=text)
        + ev("response.output_item.done", output_index=1, item=message)
        + ev("response.completed", response=response)
    )


async def responses(request: Request) -> Response:
    body = await request.json()
    response = _response(body)
    if body.get("stream"):
        return Response(_events(response), media_type="text/event-stream")
    return Response(json.dumps(response), media_type="application/json")


app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
