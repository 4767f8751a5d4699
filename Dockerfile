# claimwarden: install the locked dependencies (hash-checked) and the wheel into a venv in a builder
# stage, copy only the venv. BASE is any image with Python 3.11 and python3-venv: python:3.11-slim
# where a registry is reachable, or the local Debian bookworm base that image/base.sh builds.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
WORKDIR /src
# Dependencies first, in their own layer: a code change does not reinstall them.
COPY requirements.lock ./
RUN python -m venv /opt/claimwarden \
 && /opt/claimwarden/bin/pip install --no-cache-dir --require-hashes --no-deps --only-binary=:all: -r requirements.lock \
 && /opt/claimwarden/bin/pip uninstall --yes setuptools \
 && /opt/claimwarden/bin/python -m compileall -q /opt/claimwarden/lib
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/claimwarden/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
 && /opt/claimwarden/bin/pip install --no-cache-dir --no-deps /dist/*.whl \
 && /opt/claimwarden/bin/pip uninstall --yes pip \
 && /opt/claimwarden/bin/python -m compileall -q /opt/claimwarden/lib/python3.11/site-packages/claimwarden

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/claimwarden/bin:$PATH
COPY --from=build /opt/claimwarden /opt/claimwarden
USER 65532:65532
# Last, so that a new version or commit rebuilds no layer (image/build.sh passes both).
ARG VERSION=unknown REVISION=unknown
LABEL org.opencontainers.image.title=claimwarden org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.revision=$REVISION org.opencontainers.image.licenses=Apache-2.0
EXPOSE 8080 9090
ENTRYPOINT ["claimwarden", "run"]
