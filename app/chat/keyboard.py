"""The chat's input: lines from the user, edited with prompt_toolkit on a terminal."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prompt_toolkit import PromptSession


class Interrupted(Exception):
    """Ctrl-C at the prompt."""


class Keyboard:
    """Lines from the user: prompt_toolkit on a terminal (editing, history), plain lines
    otherwise. ``read`` raises :class:`EOFError` on Ctrl-D and :class:`Interrupted` on
    Ctrl-C."""

    def __init__(self) -> None:
        self._session: PromptSession[str] | None = None
        if sys.stdin.isatty() and sys.stdout.isatty():
            from prompt_toolkit import PromptSession

            self._session = PromptSession()

    async def read(self, prompt: str) -> str:
        if self._session is None:
            print(prompt, end="", flush=True)
            line: str = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                raise EOFError
            return line.rstrip("\n")
        try:
            typed: str = await self._session.prompt_async(prompt)
            return typed
        except KeyboardInterrupt:
            raise Interrupted from None
