# ascend-serve images, built from the repository root.
#
# CPU (ONNX Runtime and Python models), the default:
#   docker build -t ascend-serve:0.1.0 .
# Ascend NPUs: the same Dockerfile on a CANN image that has Python 3.10+ (with venv) and pyACL;
# the entrypoint sources CANN's set_env.sh before starting the server:
#   docker build --build-arg VARIANT=ascend --build-arg BASE_IMAGE=<CANN image> -t ascend-serve:0.1.0-ascend .
#
# Both stages use BASE_IMAGE so that the virtual environment built in the first runs on the same
# Python in the second; the final stage holds no build tools, pip cache or sources.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md triton_python_backend_utils.py ./
COPY server ./server
COPY protocol ./protocol
COPY scheduler ./scheduler
COPY repository ./repository
COPY backends ./backends
COPY npu ./npu
# Versions come from the ranges pinned in pyproject.toml.
RUN python3 -m venv /opt/ascend-serve \
    && /opt/ascend-serve/bin/pip install --no-cache-dir /src

FROM ${BASE_IMAGE}
# cpu | ascend: ascend makes the entrypoint source CANN's set_env.sh (ASCEND_SET_ENV).
ARG VARIANT=cpu
ENV PATH=/opt/ascend-serve/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ASCEND_SERVE_VARIANT=${VARIANT} \
    ASCEND_SET_ENV=/usr/local/Ascend/ascend-toolkit/set_env.sh
COPY --from=build /opt/ascend-serve /opt/ascend-serve
COPY deploy/docker/entrypoint.sh /usr/local/bin/ascend-serve-entrypoint
# A numeric non-root user, so Kubernetes' runAsNonRoot can verify it.
RUN useradd --uid 1000 --user-group --no-create-home --home-dir /nonexistent serve \
    && mkdir -p /models \
    && chown 1000:1000 /models
USER 1000:1000
WORKDIR /models
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["ascend-serve-entrypoint"]
CMD ["--model-repository", "/models"]
