"""Carryover's storage: every table and every query (SPEC §5). See docs/architecture.md.

- :mod:`.db` builds engines and opens read / write transactions;
- :mod:`.tables` declares the tables, ``alembic/`` (at the repository root) their Alembic
  history and :mod:`.migrate` applies it;
- :mod:`.repository` holds every query; :mod:`.errors` what it refuses.
"""
