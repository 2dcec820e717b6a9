# Smockron image: both daemons. The build stage runs the same install and
# build scripts as the README quick start (scripts/install-deps.sh,
# scripts/build.sh), so what is tested is what is shipped; it compiles only
# what is shipped (--ship: the daemons and smockron-query, Release; no tests,
# fuzzers or benchmarks). Built and run by scripts/test-image.sh (podman).
FROM debian:bookworm AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh
COPY . .
# A user's build: warnings are reported, not errors. CI builds it with
# --build-arg SMOCKRON_WERROR=ON: this is its GCC Release build.
ARG SMOCKRON_WERROR=OFF
RUN rm -rf build && SMOCKRON_WERROR=$SMOCKRON_WERROR bash scripts/build.sh --ship

# The runtime stage: the daemons and exactly the libraries they load
# (integration/test_packaging.py checks the list against ldd and dpkg -S).
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq5 libsodium23 libc-ares2 libspdlog1.10 libfmt9 libtomlplusplus3 libssl3 libhiredis0.14 libnghttp2-14 libgrpc++1.51 libprotobuf32 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin smockron
COPY --from=build /src/build/bin/smockron-proxy /src/build/bin/smockron-master /src/build/bin/smockron-query /usr/local/bin/
COPY config/ /etc/smockron/
USER 10001
# proxy, proxy admin, master admin, accounting, control
EXPOSE 8080 9106 9105 10004 10005
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["smockron-proxy", "--healthcheck", "--config", "/etc/smockron/container.toml"]
CMD ["smockron-proxy", "--config", "/etc/smockron/container.toml"]
