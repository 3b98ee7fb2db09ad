"""Package layout only; everything else is in pyproject.toml.

The Alembic scripts live once, in ``alembic/`` at the repository root (where ``alembic.ini``
and the ``alembic`` command look for them). The wheel carries them as ``app/store/migrations``,
where :mod:`app.store.migrate` finds them in an installed copy. pyproject.toml cannot map a
directory outside ``app/`` into the package while discovering the rest, hence this file.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["app", "app.*"]),
        "app.store.migrations",
        "app.store.migrations.versions",
    ],
    package_dir={"app.store.migrations": "alembic"},
)
