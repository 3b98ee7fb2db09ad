"""A client generated from the committed OpenAPI document drives a live server (contract §4).

``openapi-python-client`` generates a Python package from ``openapi/openapi.json`` (offline);
``carryover serve`` runs as a subprocess on a free loopback port with a temporary SQLite
database; the test walks the nvim/vim conversation with the client's typed models only.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from ..helpers import served

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "openapi" / "openapi.json"
PACKAGE = "carryover_client"
API_KEY = "generated-client-test-key"


def generator() -> str:
    """The ``openapi-python-client`` command of this interpreter's environment."""
    beside = Path(sys.executable).parent / "openapi-python-client"
    found = str(beside) if beside.exists() else shutil.which("openapi-python-client")
    if found is None:
        pytest.fail("openapi-python-client is not installed (it is a test dependency)")
    return found


@pytest.fixture
def client_package(tmp_path: Path) -> Iterator[ModuleType]:
    """The generated client package, imported from a temporary directory."""
    target = tmp_path / "generated" / PACKAGE
    env = dict(os.environ)
    # the generator formats its output with ruff when it finds it: the one in this environment
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        [
            generator(),
            "generate",
            "--path",
            str(COMMITTED),
            "--output-path",
            str(target),
            "--meta",
            "none",
            "--fail-on-warning",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"generation failed:\n{done.stdout}\n{done.stderr}"
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(target.parent))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(target.parent))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """``carryover serve`` on a free loopback port and a fresh SQLite file; its base URL."""
    with served(tmp_path, CARRYOVER_API_KEYS=f"client-test:{API_KEY}") as base_url:
        yield base_url


def test_the_generated_client_walks_the_seed_conversation(
    client_package: ModuleType, server: str
) -> None:
    from carryover_client import AuthenticatedClient  # type: ignore[import-not-found]
    from carryover_client.api.conversations import (  # type: ignore[import-not-found]
        create_conversation,
        get_context,
        get_conversation,
    )
    from carryover_client.api.runs import create_run, get_run  # type: ignore[import-not-found]

    # an answer's schemas are FastAPI's "-Output" ones (every field present), a request's the
    # "-Input" ones (defaults optional)
    from carryover_client.models import (  # type: ignore[import-not-found]
        AssistantMessageOutput as AssistantMessage,
    )
    from carryover_client.models import (  # type: ignore[import-not-found]
        ContextOutput as Context,
    )
    from carryover_client.models import (  # type: ignore[import-not-found]
        Conversation,
        ConversationCreate,
        ProblemDetails,
        Run,
        RunCreate,
        RunCreateOnFailure,
        RunStatus,
        TextBlockInput,
        TextBlockOutput,
        UserMessageInput,
        UserMessageOutput,
    )
    from carryover_client.types import Unset  # type: ignore[import-not-found]

    with AuthenticatedClient(
        base_url=server, token=API_KEY, raise_on_unexpected_status=True
    ) as client:
        created = create_conversation.sync_detailed(
            client=client, body=ConversationCreate(system_prompt="You are concise.")
        )
        assert created.status_code == 201
        conversation = created.parsed
        assert isinstance(conversation, Conversation)
        assert created.headers["location"] == f"/conversations/{conversation.id}"
        assert created.headers["etag"] == conversation.etag
        assert conversation.system_prompt == "You are concise."
        assert conversation.message_count == 0 and conversation.active_run_id is None

        # a bare string prompt
        first = create_run.sync(
            conversation.id, client=client, body=RunCreate(prompts=["What is nvim?"])
        )
        assert isinstance(first, Run)
        assert first.status == RunStatus.COMPLETED and first.stored is True
        assert first.on_failure.value == "keep"
        assert isinstance(first.final, AssistantMessage)
        [answer] = first.final.content
        assert isinstance(answer, TextBlockOutput)
        assert answer.text == 'Echo: I saw 1 message. You said: "What is nvim?"'
        assert isinstance(first.context, Context) and len(first.context.messages) == 2

        # a typed user message, conditional on the state the first run stored, minimal answer
        second = create_run.sync_detailed(
            conversation.id,
            client=client,
            body=RunCreate(
                prompts=[
                    UserMessageInput(content=[TextBlockInput(text="How does it differ from vim?")])
                ],
                on_failure=RunCreateOnFailure.KEEP,
            ),
            if_match=first.etag,
            prefer="return=minimal",
        )
        assert second.status_code == 201
        run = second.parsed
        assert isinstance(run, Run)
        assert second.headers["etag"] == run.etag and run.base_etag == first.etag
        assert isinstance(run.context, Unset)  # left out by Prefer: return=minimal
        assert isinstance(run.final, AssistantMessage)
        reply = run.final.content[0]
        assert isinstance(reply, TextBlockOutput)
        assert reply.text == 'Echo: I saw 3 messages. You said: "How does it differ from vim?"'
        [prompt] = run.prompts
        assert isinstance(prompt, UserMessageOutput)
        assert [m.__class__ for m in run.new_messages] == [UserMessageOutput, AssistantMessage]

        # a stale If-Match is a typed problem
        stale = create_run.sync_detailed(
            conversation.id,
            client=client,
            body=RunCreate(prompts=["again"]),
            if_match=first.etag,
        )
        assert stale.status_code == 412
        assert isinstance(stale.parsed, ProblemDetails)
        assert stale.parsed.type_ == "https://carryover.dev/problems/precondition-failed"

        stored = get_context.sync_detailed(conversation.id, client=client)
        assert stored.status_code == 200 and stored.headers["etag"] == run.etag
        context = stored.parsed
        assert isinstance(context, Context)
        assert context.system_prompt == "You are concise." and context.summary == ""
        kinds = [m.__class__ for m in context.messages]
        assert kinds == [UserMessageOutput, AssistantMessage, UserMessageOutput, AssistantMessage]
        user_texts = [
            m.content[0].text for m in context.messages if isinstance(m, UserMessageOutput)
        ]
        assert user_texts == ["What is nvim?", "How does it differ from vim?"]
        last = context.messages[-1]
        assert isinstance(last, AssistantMessage) and last.content[0].text == reply.text
        assert last.usage.output_tokens > 0

        unchanged = get_context.sync_detailed(
            conversation.id, client=client, if_none_match=run.etag
        )
        assert unchanged.status_code == 304

        record = get_run.sync(conversation.id, run.run_id, client=client)
        assert isinstance(record, Run) and record.status == RunStatus.COMPLETED
        assert record.final is not None and record.final.content[0].text == reply.text

        meta = get_conversation.sync(conversation.id, client=client)
        assert isinstance(meta, Conversation)
        assert (meta.message_count, meta.run_count, meta.etag) == (4, 2, run.etag)


def test_the_generated_client_drives_a_pause_and_resume(
    client_package: ModuleType, server: str
) -> None:
    """Client tools and approvals (docs/tools.md) with the typed models only: a client call
    pauses the run, its result resumes it; an approval-gated call pauses, is approved; a run
    that leaves a call unanswered is a typed 409."""
    from carryover_client import AuthenticatedClient  # type: ignore[import-not-found]
    from carryover_client.api.conversations import (  # type: ignore[import-not-found]
        create_conversation,
        get_conversation,
    )
    from carryover_client.api.runs import create_run, get_run  # type: ignore[import-not-found]
    from carryover_client.models import (  # type: ignore[import-not-found]
        Approval,
        ClientTool,
        ClientToolParameters,
        Conversation,
        ConversationCreate,
        PendingCallKind,
        ProblemDetails,
        RequiredAction,
        Run,
        RunCreate,
        RunStatus,
        TextBlockInput,
        TextBlockOutput,
        ToolResultMessageInput,
    )

    lookup = ClientTool(
        name="lookup",
        description="Look a word up",
        parameters=ClientToolParameters.from_dict(
            {"type": "object", "properties": {"word": {"type": "string"}}}
        ),
    )
    with AuthenticatedClient(
        base_url=server, token=API_KEY, raise_on_unexpected_status=True
    ) as client:
        conversation = create_conversation.sync(client=client, body=ConversationCreate())
        assert isinstance(conversation, Conversation)
        cid = conversation.id

        paused = create_run.sync(
            cid,
            client=client,
            body=RunCreate(prompts=['/tool lookup {"word": "nvim"}'], tools=[lookup]),
        )
        assert isinstance(paused, Run)
        assert paused.status == RunStatus.REQUIRES_ACTION and paused.stored is True
        assert isinstance(paused.required_action, RequiredAction)
        [call] = paused.required_action.tool_calls
        assert (call.name, call.kind, call.arguments) == (
            "lookup",
            PendingCallKind.CLIENT,
            '{"word": "nvim"}',
        )
        record = get_run.sync(cid, paused.run_id, client=client)
        assert isinstance(record, Run) and record.required_action == paused.required_action
        meta = get_conversation.sync(cid, client=client)
        assert isinstance(meta, Conversation)
        assert meta.pending_tool_calls == paused.required_action.tool_calls

        unanswered = create_run.sync_detailed(cid, client=client, body=RunCreate(prompts=["go on"]))
        assert unanswered.status_code == 409
        assert isinstance(unanswered.parsed, ProblemDetails)
        assert unanswered.parsed.type_ == "https://carryover.dev/problems/tool-results-required"

        result = ToolResultMessageInput(
            tool_call_id=call.id,
            tool_name="lookup",
            content=[TextBlockInput(text="a text editor")],
        )
        resumed = create_run.sync(cid, client=client, body=RunCreate(prompts=[result]))
        assert isinstance(resumed, Run) and resumed.status == RunStatus.COMPLETED
        assert resumed.required_action is None
        [answer] = resumed.final.content
        assert isinstance(answer, TextBlockOutput) and "a text editor" in answer.text

        gated = create_run.sync(
            cid,
            client=client,
            body=RunCreate(prompts=["/tool time_now {}"], require_approval=["time_now"]),
        )
        assert isinstance(gated, Run) and gated.status == RunStatus.REQUIRES_ACTION
        [approval_call] = gated.required_action.tool_calls
        assert approval_call.kind == PendingCallKind.APPROVAL
        approved = create_run.sync(
            cid,
            client=client,
            body=RunCreate(approvals=[Approval(tool_call_id=approval_call.id, approve=True)]),
        )
        assert isinstance(approved, Run) and approved.status == RunStatus.COMPLETED
        meta = get_conversation.sync(cid, client=client)
        assert isinstance(meta, Conversation) and meta.pending_tool_calls == []
