# ascend-serve image. The default base is a slim CPython image (ONNX Runtime and Python models on
# the CPU). For Ascend NPUs, build on a CANN image that has Python 3.10+ and pyACL:
#   docker build --build-arg BASE_IMAGE=<your CANN toolkit image> -t ascend-serve:npu .
# and run it with the NPU devices and driver mounted (see README, "Running on Ascend").
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/ascend-serve
COPY pyproject.toml README.md ./
COPY server ./server
COPY protocol ./protocol
COPY scheduler ./scheduler
COPY repository ./repository
COPY backends ./backends
COPY npu ./npu
COPY triton_python_backend_utils.py ./
RUN python3 -m pip install --no-cache-dir . \
    && useradd --create-home --uid 1000 serve \
    && mkdir -p /models && chown serve /models

USER serve
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD python3 -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status == 200 else 1)"
ENTRYPOINT ["ascend-serve"]
CMD ["--model-repository", "/models"]
