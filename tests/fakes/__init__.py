"""Fake model providers: real HTTP servers on 127.0.0.1 with scripted answers.

- :mod:`tests.fakes.openai_fake` — ``OpenAIFake`` and the ``openai_fake`` fixture;
- :mod:`tests.fakes.anthropic_fake` — ``AnthropicFake`` and the ``anthropic_fake`` fixture;
- :mod:`tests.fakes.openai_responses_fake` — ``ResponsesFake`` (OpenAI's Responses API, stateless)
  and the ``responses_fake`` fixture.

Use them as context managers (``with OpenAIFake() as fake: ...``) or import the fixture into
a ``conftest.py``: ``from tests.fakes.openai_fake import openai_fake as openai_fake``.
"""
