"""What the chat shows: one-line texts of tool calls and refusals, and the :class:`Screen`
that prints a streamed run through one rich console."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .sse import ServerEvent

if TYPE_CHECKING:
    import httpx
    from rich.console import Console

#: how much of a tool call's arguments or result one line shows
SHOWN_CHARACTERS = 72


def shorten(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """One line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def problem_text(response: httpx.Response) -> str:
    """A refusal as one line: the problem's title and detail, else the status and body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("title"):
        detail = f": {body['detail']}" if body.get("detail") else ""
        return f"{response.status_code} {body['title']}{detail}"
    return f"{response.status_code} {shorten(response.text) or response.reason_phrase}"


def _text_of(message: dict[str, Any]) -> str:
    return "".join(
        block.get("text", "") for block in message.get("content", []) if block.get("type") == "text"
    )


class Screen:
    """Everything the chat prints, through one rich console: the streamed answer, one line per
    tool call, result and compaction, and the end of a run when it did not complete."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._open: str | None = None  # the kind of delta the current line is part of

    def line(self, text: str, style: str = "") -> None:
        self.end_line()
        self.console.print(text, style=style or None, markup=False, highlight=False)

    def end_line(self) -> None:
        if self._open is not None:
            self.console.print()
            self._open = None

    def delta(self, kind: str, text: str) -> None:
        if self._open != kind:
            self.end_line()
            label, style = (
                ("thinking: ", "dim italic") if kind == "thinking" else ("agent: ", "bold")
            )
            self.console.print(label, style=style, end="", markup=False, highlight=False)
            self._open = kind
        shade = "dim italic" if kind == "thinking" else None
        self.console.print(text, style=shade, end="", markup=False, highlight=False, soft_wrap=True)

    def event(self, event: ServerEvent) -> None:
        data = event.data
        if event.event == "delta":
            if data.get("kind") in ("text", "thinking") and data.get("text"):
                self.delta(data["kind"], data["text"])
        elif event.event == "tool.started":
            self.line(f"  [tool] {data['name']}({shorten(data.get('arguments', ''))})", "cyan")
        elif event.event == "tool.finished":
            verb = "failed" if data.get("is_error") else "returned"
            style = "red" if data.get("is_error") else "cyan"
            self.line(f"  [tool] {data['tool_name']} {verb}: {shorten(_text_of(data))}", style)
        elif event.event == "compaction":
            folded = len(data.get("folded", []))
            self.line(
                f"  [compaction] {data.get('reason', '')}: folded {folded} message"
                f"{'s' if folded != 1 else ''}, {data.get('tokens_before', '?')} -> "
                f"{data.get('tokens_after', '?')} tokens",
                "magenta",
            )

    def finished(self, run: dict[str, Any]) -> None:
        self.end_line()
        status = run.get("status")
        if status == "completed":
            return
        error = run.get("error") or {}
        title, detail = str(error.get("title") or ""), str(error.get("detail") or "")
        # a detail that only repeats the title ("The run was cancelled") is said once
        said = [title] + ([detail] if detail.strip(". ").lower() != title.lower() else [])
        why = f": {' - '.join(p for p in said if p)}" if error else ""
        style = "yellow" if status in ("cancelled", "requires_action") else "red"
        self.line(f"[run {run.get('run_id', '')} {status}{why}]", style)
