# syntax=docker/dockerfile:1
# Carryover: build a virtual environment, then copy it into a slim image run as a non-root user.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# pyproject names README.md as the package's readme, so it is part of the build context;
# setup.py puts alembic/ (the migration scripts) into the wheel, where `serve` runs them.
COPY pyproject.toml setup.py README.md ./
COPY app ./app
COPY alembic ./alembic
RUN python -m venv /opt/venv && /opt/venv/bin/pip install .

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CARRYOVER_DATABASE_URL=sqlite:////data/carryover.db
RUN useradd --system --uid 10001 --user-group --home-dir /data --create-home carryover
COPY --from=build /opt/venv /opt/venv
USER carryover
WORKDIR /data
# The embedded SQLite database lives here; with PostgreSQL (CARRYOVER_DATABASE_URL) it stays empty.
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CARRYOVER_PORT', '8000'), timeout=4)"]

# Listening on 0.0.0.0 is refused unless CARRYOVER_API_KEYS is set (tenant:key pairs), or
# CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC=true says something in front authenticates requests.
# `serve` applies the database migrations before it starts.
CMD ["carryover", "serve", "--host", "0.0.0.0"]
