# The project image: the API (`gate serve`), the Celery worker (`gate worker`) and the sim
# engine (`python -m simengine`) all run from it; docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gate ./gate
COPY loadgen ./loadgen
COPY simengine ./simengine
COPY migrations ./migrations
COPY examples ./examples
RUN pip install . \
    && useradd --create-home --uid 1000 gate \
    && mkdir -p /data \
    && chown gate /data

# An installed package has no examples/ beside it: name the example inventory and specs.
ENV GATE_DATA_DIR=/data \
    GATE_INVENTORY=/app/examples/inventory/local.yaml \
    GATE_SPEC_DIR=/app/examples/specs

USER gate
EXPOSE 8080
CMD ["gate", "serve", "--host", "0.0.0.0", "--port", "8080"]
