# claimwarden: build the wheel in a builder stage, install it into a venv, copy only the venv.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m venv /opt/claimwarden \
 && /opt/claimwarden/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/claimwarden/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
 && /opt/claimwarden/bin/pip install --no-cache-dir /dist/*.whl \
 && /opt/claimwarden/bin/pip uninstall --yes pip \
 && /opt/claimwarden/bin/python -m compileall -q /opt/claimwarden

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/claimwarden/bin:$PATH
COPY --from=build /opt/claimwarden /opt/claimwarden
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["claimwarden", "run"]
