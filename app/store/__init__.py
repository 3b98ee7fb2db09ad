"""Carryover's storage: every table and every query (contract §5). See docs/architecture.md.

- :mod:`.db` builds engines and opens read / write transactions;
- :mod:`.tables` declares the tables, ``alembic/`` (at the repository root) their Alembic
  history and :mod:`.migrate` applies it;
- the aggregates hold the queries: :mod:`.conversations`, :mod:`.runs`, :mod:`.leases`,
  :mod:`.idempotency`, :mod:`.records` (sharing :mod:`._sql`); :mod:`.repository` puts them
  together as one handle; :mod:`.errors` says what they refuse.
"""
