"""Alembic history of the store's schema. Run it through :mod:`app.store.migrate`."""
