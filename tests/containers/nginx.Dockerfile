# A stand-in for the nginx:stable-bookworm image that docker/docker-compose.replicas.yml names,
# built from Debian 12's own nginx-light on the local debian:12-slim, so tests/containers/check.sh
# needs no image registry. Like the official image: nginx in the foreground, logs to the
# container's output, SIGQUIT for a graceful stop.
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx-light \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sf /dev/stdout /var/log/nginx/access.log \
 && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
