# claimwarden: build a wheel, install it into a venv, copy only the venv into a slim image.
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/claimwarden && /opt/claimwarden/bin/pip install --no-cache-dir --upgrade pip build
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/claimwarden/bin/python -m build --wheel --outdir /dist . \
 && /opt/claimwarden/bin/pip install --no-cache-dir /dist/*.whl \
 && /opt/claimwarden/bin/pip uninstall --yes build pip \
 && /opt/claimwarden/bin/python -m compileall -q /opt/claimwarden

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/claimwarden/bin:$PATH
COPY --from=build /opt/claimwarden /opt/claimwarden
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["claimwarden", "run"]
