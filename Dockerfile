# syntax=docker/dockerfile:1
# The control plane image: `docker build -t pilot:dev .`, then `kubectl apply -k deploy/`.
#
# Stage 1 builds wheels for the project and every dependency; stage 2 installs them from that
# wheelhouse only (--no-index), so the final image has no compilers, build tools, pip caches,
# wheels or source tree: just the interpreter, site-packages and the console scripts.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pilot ./pilot
# Only binary wheels for the dependencies (grpcio, protobuf, pydantic-core... all publish them),
# so no compiler is needed even here; the project itself (a local directory) is pure Python.
RUN pip wheel --wheel-dir /wheels --only-binary=:all: .

FROM ${PYTHON_IMAGE}
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheelhouse is bind-mounted for this one step, never copied into a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels pilot \
 && groupadd --system --gid 1337 istio-proxy \
 && useradd --system --uid 1337 --gid 1337 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin istio-proxy
# istiod's layout: ./etc/istio/config/mesh (--meshConfig) and ./etc/cacerts (ROOT_CA_DIR) from /.
WORKDIR /
USER 1337:1337
# 8080 /ready + debug, 15010 xDS, 15012 TLS xDS + CA, 15014 /metrics, 15017 webhooks.
EXPOSE 8080 15010 15012 15014 15017
ENTRYPOINT ["pilot-discovery"]
CMD ["discovery"]
