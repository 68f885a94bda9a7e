# syntax=docker/dockerfile:1
#
# volcano-job-webhook image: the `volcano-webhook` console script (webhook `serve`, sidecar
# `reconcile`, and the `certs` job of the self-managed install), non-root, for a read-only root
# file system.
#
#   docker build -t ghcr.io/volcano-job-webhook/volcano-job-webhook:0.1.0 .
#
# Two stages from the same base image: `build` makes a wheel of this repository and installs it,
# with its dependencies, into a virtualenv at /opt/venv; the final stage copies only that virtualenv.
# No compiler, pip, pip cache, build backend or source tree reaches the final image. Both stages must
# use the same base: the virtualenv's interpreter is a symlink to whatever `python` the base has
# (/usr/local/bin/python3.11 in python:3.11-slim, /usr/bin/python3.11 in a Debian-packaged Python),
# and it resolves in the final stage only because that stage is the same image.
# Pin the base by digest for reproducible builds, e.g.
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest> .
# Where no registry is reachable, hack/standin-base.sh makes a local stand-in with Debian's Python
# 3.11 (docs/install.md, "1. Build the image").
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is made of (pyproject.toml names README.md as the package readme). The
# .dockerignore is an allow-list of the same paths, so certs/, .venv/, tests/ never enter the context.
COPY pyproject.toml README.md ./
COPY plugins/ plugins/
COPY webhook/ webhook/
COPY examples/ examples/
# The virtualenv's own pip and setuptools are used once, then removed: nothing runs them at run time.
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir /wheels/*.whl \
 && /opt/venv/bin/python -m pip uninstall -q -y pip setuptools \
 && /opt/venv/bin/volcano-webhook --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="volcano-job-webhook" \
      org.opencontainers.image.description="Volcano's job plugins as an admission webhook and reconciler" \
      org.opencontainers.image.source="https://github.com/volcano-job-webhook/volcano-job-webhook" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
# A named account for uid/gid 65532 (the distroless "nonroot" ids the manifests run as); no home,
# no shell. The manifests set runAsUser/runAsGroup too, so runAsNonRoot can be verified either way.
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin nonroot
# Byte code was compiled at install time in the build stage; with a read-only root file system the
# interpreter must not try to write more. /tmp is the only writable path (an emptyDir in the manifests).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
USER 65532:65532
# Writable wherever the image runs, so a bare `docker run ... serve` can make its development
# certificates in ./certs; the manifests always pass --certs-dir.
WORKDIR /tmp
# 8443: HTTPS admission webhook (serve); 8081: reconciler probes and metrics (reconcile).
EXPOSE 8443 8081
ENTRYPOINT ["volcano-webhook"]
CMD ["serve"]
