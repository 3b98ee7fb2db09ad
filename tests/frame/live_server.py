"""A real ``carryover serve`` in a subprocess, for the tests of what it prints and when."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from ..helpers import free_port

__all__ = ["LiveServer", "free_port", "live_server"]


class LiveServer:
    def __init__(self, process: subprocess.Popen[str], port: int, stderr: Path) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.stderr_path = stderr
        self.stdout_lines: list[str] = []

    @property
    def stdout(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    def read_until(self, found: Callable[[str], bool]) -> str:
        """Read stdout line by line (blocking; the test's timeout bounds it) until a line
        satisfies ``found``; that line. Fails when stdout ends first."""
        for line in self.stdout:
            self.stdout_lines.append(line)
            if found(line):
                return line
        raise AssertionError(
            f"the server ended (status {self.process.wait()}) without printing the line; "
            f"stdout: {''.join(self.stdout_lines)!r}; stderr: {self.stderr_path.read_text()!r}"
        )

    def stop(self) -> tuple[str, str]:
        """Stop it as Ctrl-C does; everything it printed on stdout and stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self.wait()

    def wait(self) -> tuple[str, str]:
        """Wait for it to end; everything it printed on stdout and stderr."""
        # read through the text wrapper (communicate() would skip what it has buffered)
        self.stdout_lines.append(self.stdout.read())
        self.process.wait(timeout=60)
        return "".join(self.stdout_lines), self.stderr_path.read_text(encoding="utf-8")


@contextmanager
def live_server(
    tmp_path: Path, *args: str, port: int | None = None, **env: str
) -> Iterator[LiveServer]:
    """``carryover serve --port PORT ARGS`` on a fresh SQLite file in ``tmp_path``, with the
    environment's CARRYOVER_* variables replaced by ``env``."""
    port = port or free_port()
    environment = {k: v for k, v in os.environ.items() if not k.upper().startswith("CARRYOVER_")}
    environment.update({"CARRYOVER_DATABASE_URL": f"sqlite:///{tmp_path / 'carryover.db'}"})
    environment.update(env)
    stderr = tmp_path / f"stderr-{port}-{len(list(tmp_path.iterdir()))}.txt"
    with stderr.open("w", encoding="utf-8") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port), *args],
            cwd=tmp_path,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    server = LiveServer(process, port, stderr)
    try:
        yield server
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)
        if process.stdout is not None:
            process.stdout.close()
