# pytriton in a slim, non-root image: `pytriton serve` runs under tini, so SIGTERM reaches it (and its
# lame duck and drain run) and child processes are reaped.
#
#   docker build -t pytriton:latest .
#   docker run --rm -p 8000-8002:8000-8002 -v "$PWD/deploy/kserve/model:/models:ro" pytriton:latest
#
# The argument is what `pytriton serve` loads (default /models: a directory with model.py, or FILE.py:bind,
# or module:function). Every TritonConfig option is a PYTRITON_TRITON_CONFIG_<NAME> variable and every
# ServerLimits field a PYTRITON_LIMIT_<NAME> variable. The lame duck (5 s here: unready but serving after
# SIGTERM, so that a balancer stops sending first) should exceed your balancer's health-check detection time.

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY pytriton ./pytriton
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.12-slim
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin pytriton
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 \
    PYTRITON_TRITON_CONFIG_HTTP_PORT=8000 \
    PYTRITON_TRITON_CONFIG_GRPC_PORT=8001 \
    PYTRITON_TRITON_CONFIG_METRICS_PORT=8002 \
    PYTRITON_TRITON_CONFIG_EXIT_TIMEOUT_SECS=30 \
    PYTRITON_LIMIT_LAME_DUCK_S=5
USER 1000:1000
WORKDIR /models
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-m", "pytriton.cli.healthcheck"]
ENTRYPOINT ["tini", "--", "pytriton", "serve"]
CMD ["/models"]
