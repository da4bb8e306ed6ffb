# Prometheus for the end-to-end stack (tests/e2e), not a product image: Debian's own `prometheus` package, the release
# the suite's live Prometheus tests run on the host (`make system-deps`), in a container on the stack's network.
# BASE_IMAGE: debian:bookworm-slim, or the local debootstrap base (`make local-base`) where no registry is reachable.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# policy-rc.d: the package's maintainer scripts must not start a daemon inside the build.
# hadolint ignore=DL3008
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d \
    && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d
USER 65534:65534
WORKDIR /tmp
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
