# The Chital daemon. Build: docker build -t chital .   (--build-arg BASE=... for another base image)
ARG BASE=python:3.12-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY channels ./channels
COPY agent ./agent
RUN python3 -m pip install . && useradd --create-home --uid 10001 chital && mkdir -p /data && chown chital /data
COPY skills ./skills
COPY config.yaml ./config.yaml

USER chital
ENV CHITAL_CONFIG=/app/config.yaml CHITAL_DATA=/data
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=4)" || exit 1
CMD ["chital", "run"]
