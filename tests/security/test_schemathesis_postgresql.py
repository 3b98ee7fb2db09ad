"""The native API fuzzed on PostgreSQL: test_schemathesis.py's tests (see there), in a module of
their own so that a parallel run (``--dist loadscope``) can put each engine on its own worker."""

from __future__ import annotations

from .conftest import fuzz_on
from .test_schemathesis import (  # noqa: F401  (the tests and the module's fixtures)
    fuzzed_app,
    mcp_server,
    session,
    test_api,
    test_api_document_is_what_the_app_serves,
    test_stateful,
)

pytestmark = fuzz_on("postgresql")
