# The Strata server image: `strata up` (HTTP API + Spark driver + run worker).
#
# Build and run it with docker-compose.yml next to this file (PostgreSQL and a Spark
# standalone cluster), or alone: with no STRATA_DATABASE_URL / STRATA_SPARK_MASTER it
# starts an embedded PostgreSQL and local Spark in /data.
#
# bookworm, not the newer default Debian of python:3.11-slim: bookworm's default JRE is
# OpenJDK 17, the Java of the apache/spark:4.0.1 cluster images (driver and executors on
# the same Java major version). Python is 3.11 here and 3.10 in the Spark images; see the
# note in docker-compose.yml for why that is harmless today.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY rewriter ./rewriter
COPY migrations ./migrations
COPY sql ./sql
# sql/ and the migrations' frozen SQL are package data: the install ships them.
RUN pip install .

WORKDIR /data
VOLUME ["/data"]
EXPOSE 8080

# uvicorn stops gracefully on SIGTERM (docker stop); `strata up` then stops its worker,
# Spark and, when embedded, PostgreSQL.
CMD ["strata", "up", "--host", "0.0.0.0", "--port", "8080", "--data-dir", "/data"]
