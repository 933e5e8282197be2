# A stand-in for the redis:7.0-bookworm image that docker/docker-compose.yml names, built from
# Debian 12's own redis-server (7.0) on the local debian:12-slim, so tests/containers/check.sh
# needs no image registry. Like the official image: redis-server and redis-cli, run as redis.
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server redis-tools \
 && rm -rf /var/lib/apt/lists/*
USER redis
WORKDIR /var/lib/redis
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
