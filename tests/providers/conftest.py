from tests.fakes.anthropic_fake import anthropic_fake as anthropic_fake
from tests.fakes.openai_fake import openai_fake as openai_fake
from tests.fakes.openai_responses_fake import responses_fake as responses_fake
