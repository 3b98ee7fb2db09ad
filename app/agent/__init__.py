"""Carryover's agent core: a plain async library (no HTTP, no SQL). See docs/architecture.md."""
