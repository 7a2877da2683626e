# fifolane image: the worker (default entrypoint) and the `fifolane` CLI.
#   docker build -t fifolane .                                  # worker + CLI
#   docker build -t fifolane-spark --build-arg EXTRAS=spark .   # + PySpark and a JRE (views)
# The spark extra pins pyspark to the Spark version of the apache/spark image in
# docker-compose.yml (spark/packages.py: SPARK_VERSION): driver and cluster must match.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FIFOLANE_HOME=/var/lib/fifolane

# PySpark needs a JVM; the plain worker image stays without one.
RUN if [ -n "$EXTRAS" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
      && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /app
COPY . .
RUN pip install ".${EXTRAS:+[$EXTRAS]}" \
    && useradd --create-home --uid 1000 fifolane \
    && mkdir -p /var/lib/fifolane /data \
    && chown -R fifolane:fifolane /var/lib/fifolane /data

# Not root: the worker only needs its RocksDB directory under FIFOLANE_HOME. The uid (1000) is
# also the user of docker-compose's spark-worker: the views job (driver) and the executors
# write the shared views volume as the same user.
USER fifolane
VOLUME ["/var/lib/fifolane"]
# Prometheus metrics (`--metrics-port 9100` in docker-compose.yml).
EXPOSE 9100
ENTRYPOINT ["python", "-m", "services.worker"]
