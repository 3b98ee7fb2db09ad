"""A failed response's ``error.code`` is one of OpenAI's, chosen by why its run failed: the
client's input (``invalid_prompt``), its quota (``rate_limit_exceeded``), or else the service
or the provider behind it (``server_error``)."""

from __future__ import annotations

from typing import get_args

import pytest
from openai.types.responses.response_error import ResponseError

from app.agent.messages import AttemptError
from app.api.v1.views import response_error_code


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (AttemptError(kind="fatal", message="m", code="context_too_large"), "invalid_prompt"),
        (AttemptError(kind="overflow", message="the window"), "invalid_prompt"),
        (AttemptError(kind="fatal", message="m", code="quota_exceeded"), "rate_limit_exceeded"),
        (AttemptError(kind="fatal", message="m", code="validation_error"), "invalid_prompt"),
        (AttemptError(kind="fatal", message="the provider said 400", status=400), "server_error"),
        (AttemptError(kind="retryable", message="503 three times", status=503), "server_error"),
        (AttemptError(kind="fatal", message="m", code="output_invalid"), "server_error"),
        (AttemptError(kind="internal", message="m"), "server_error"),
        (None, "server_error"),
    ],
)
def test_the_code_says_whose_the_failure_is(error: AttemptError | None, code: str) -> None:
    found = response_error_code(error.model_dump() if error is not None else None)
    assert found == code
    assert found in get_args(ResponseError.model_fields["code"].annotation)
