"""Carryover's storage: every table and every query (contract §5). See docs/architecture.md.

- :mod:`.db` builds engines and opens read / write transactions;
- :mod:`.tables` declares the tables, ``alembic/`` (at the repository root) their Alembic
  history and :mod:`.migrate` applies it;
- the aggregates hold the queries, one store object each: :mod:`.conversations`, :mod:`.runs`,
  :mod:`.queue`, :mod:`.leases`, :mod:`.idempotency`, :mod:`.records`, :mod:`.events`,
  :mod:`.webhooks`, … (sharing :mod:`._sql`); :mod:`.stores` builds them on one engine and clock
  (``Stores``); :mod:`.errors` says what they refuse.
"""
