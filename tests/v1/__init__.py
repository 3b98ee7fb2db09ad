"""The OpenAI-compatible surface (/v1), driven by the official openai package."""
