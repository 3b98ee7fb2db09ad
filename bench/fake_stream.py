"""A fake OpenAI Chat Completions endpoint that streams a long answer in small pieces, at once
(or ``--delay-ms`` apart), for bench/streaming.py: what a streamed delta costs Carryover.

    fake_stream.py PORT [--deltas 2000] [--chars 4] [--delay-ms 0]

``POST /v1/chat/completions`` with ``stream: true`` answers ``--deltas`` content chunks of
``--chars`` characters each (then the finish chunk, the usage chunk, ``[DONE]``), each chunk its
own write; ``POST /whole/v1/chat/completions`` streams the same text as ONE content chunk, so the
difference between the two is what the deltas themselves cost. Without ``stream`` both answer
the whole text as one completion. Like shared/bench/fake_openai.py: uvicorn + starlette,
127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

ARGS = argparse.Namespace(deltas=2000, chars=4, delay_ms=0.0)


def pieces(deltas: int, chars: int) -> list[str]:
    """``deltas`` pieces of exactly ``chars`` characters: ``w0 w0 …``, ``w1 w1 …``, …"""
    return [(f"w{i} " * chars)[:chars] for i in range(deltas)]


def chunk(base: dict[str, object], delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode()


@functools.cache
def chunks(split: bool, model: str) -> tuple[bytes, ...]:
    """The stream's writes, built once: the fake's own cost per request stays small."""
    parts = pieces(ARGS.deltas, ARGS.chars)
    base = {"id": "chatcmpl-stream-fake", "object": "chat.completion.chunk", "created": 0}
    base["model"] = model
    out = [chunk(base, {"role": "assistant", "content": ""})]
    out += [chunk(base, {"content": p}) for p in (parts if split else ["".join(parts)])]
    out.append(chunk(base, {}, "stop"))
    return tuple(out)


def usage(n: int) -> dict[str, int]:
    return {
        "prompt_tokens": 10 * n,
        "completion_tokens": ARGS.deltas,
        "total_tokens": 10 * n + ARGS.deltas,
    }


async def chat(request: Request, split: bool) -> Response:
    body = await request.json()
    n = len(body.get("messages", []))
    model = str(body.get("model", "m"))
    if not body.get("stream"):
        text = "".join(pieces(ARGS.deltas, ARGS.chars))
        message = {"role": "assistant", "content": text}
        payload = {
            "id": "chatcmpl-stream-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": usage(n),
        }
        return Response(json.dumps(payload), media_type="application/json")
    writes = chunks(split, model)
    last = {"id": "chatcmpl-stream-fake", "object": "chat.completion.chunk", "created": 0}
    last |= {"model": model, "choices": [], "usage": usage(n)}
    tail = f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()
    delay = ARGS.delay_ms / 1000

    async def stream() -> AsyncIterator[bytes]:
        yield writes[0]
        for piece in writes[1:]:
            if delay:
                await asyncio.sleep(delay)
            yield piece
        yield tail

    return StreamingResponse(stream(), media_type="text/event-stream")


async def split_chat(request: Request) -> Response:
    return await chat(request, True)


async def whole_chat(request: Request) -> Response:
    return await chat(request, False)


app = Starlette(
    routes=[
        Route("/v1/chat/completions", split_chat, methods=["POST"]),
        Route("/chat/completions", split_chat, methods=["POST"]),
        Route("/whole/v1/chat/completions", whole_chat, methods=["POST"]),
        Route("/whole/chat/completions", whole_chat, methods=["POST"]),
    ]
)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--chars", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.parse_args(namespace=ARGS)
    uvicorn.run(app, host="127.0.0.1", port=ARGS.port, log_level="warning", access_log=False)
