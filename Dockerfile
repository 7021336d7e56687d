# The one delayq image: `delayq operator` (the chart's Deployment) and `delayq serve` (the
# delay-service pods the operator creates). Runs as a non-root user with a read-only root
# filesystem in Kubernetes (the pods mount an in-memory /tmp).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY operator ./operator
RUN pip install --no-cache-dir --disable-pip-version-check --prefix=/install ".[operator]"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
RUN groupadd --system --gid 10001 delayq \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent delayq
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["delayq"]
CMD ["operator"]
