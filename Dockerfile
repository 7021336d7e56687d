# The one delayq image: `delayq operator` (the chart's Deployment) and `delayq serve` (the
# delay-service pods the operator creates). Runs as a non-root user with a read-only root
# filesystem in Kubernetes (the pods mount an in-memory /tmp). It carries the `operator` and
# `tracing` extras (requirements/image.txt locks `delayq[operator,tracing]`: the chart's
# topics.tracing turns the pods' traces on); the Spark pipeline (`delayq[pipeline]`: pyspark,
# pyarrow) runs in a Spark image of its own.
#
# BASE is any Debian-like image with python3 (>= 3.11) and its venv module. The default names an
# exact patch release (and bookworm: `python:3.11-slim` moved to trixie); to pin it by content
# too, add the digest your registry reports for it:
#   --build-arg BASE=python:3.11.16-slim-bookworm@sha256:<digest>
# The e2e tier builds it on a Debian base made with debootstrap (e2e/images.sh), as no registry
# is reachable there.
ARG BASE=python:3.11.16-slim-bookworm

FROM ${BASE} AS build
WORKDIR /src
RUN python3 -m venv /opt/delayq && python3 -m venv /opt/sbom
# The dependencies first, in a layer that changes only with the lock files (scripts/lock.sh):
# exactly the pinned versions, each file checked against its hash, wheels only (nothing built
# from source, so no unpinned build backend), no resolver (--no-deps: the lock is complete).
# /opt/sbom holds the SBOM generator; it stays in this stage.
COPY requirements/image.txt requirements/sbom.txt ./requirements/
RUN /opt/delayq/bin/pip install --no-cache-dir --disable-pip-version-check --require-hashes \
      --no-deps --only-binary=:all: -r requirements/image.txt \
    && /opt/sbom/bin/pip install --no-cache-dir --disable-pip-version-check --require-hashes \
      --no-deps --only-binary=:all: -r requirements/sbom.txt
# The project itself, built with the locked setuptools (no build isolation: nothing fetched),
# then the SBOM of what the image ships: every package of /opt/delayq (CycloneDX JSON).
COPY pyproject.toml README.md LICENSE ./
COPY operator ./operator
RUN /opt/delayq/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps \
      --no-build-isolation . \
    && /opt/delayq/bin/pip check \
    && mkdir -p /usr/share/doc/delayq \
    && /opt/sbom/bin/cyclonedx-py environment --output-reproducible --output-format JSON \
      --output-file /usr/share/doc/delayq/sbom.cdx.json /opt/delayq/bin/python \
    && find /opt/delayq -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/delayq/bin:$PATH
COPY --from=build /opt/delayq /opt/delayq
COPY --from=build /usr/share/doc/delayq/sbom.cdx.json /usr/share/doc/delayq/sbom.cdx.json
RUN groupadd --system --gid 10001 delayq \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent delayq
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["delayq"]
CMD ["operator"]
