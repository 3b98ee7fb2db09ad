"""Carryover: an HTTP conversation service for LLM agents."""

__version__ = "0.1.0"
