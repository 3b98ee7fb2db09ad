from tests.fakes.openai_fake import openai_fake as openai_fake
