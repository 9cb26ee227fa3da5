# kvsidecar container image: a multi-stage build on Debian 12.
#
#   docker build -t kvsidecar:0.1.0 .
#   docker run --rm -p 5555:5555 -p 5600:5600 -p 5700:5700 -p 9090:9090 \
#     --shm-size=1g kvsidecar:0.1.0 --set gpu.backend=host --set http.listen=0.0.0.0:9090
#
# http.listen defaults to loopback (127.0.0.1:9090: the HEALTHCHECK below
# still reaches it); publishing 9090 needs 0.0.0.0, and then the control
# plane's state-changing calls need http.admin_token / KVSIDECAR_ADMIN_TOKEN.
#
# Stage 1 builds the binary and the .deb (cpack) with the Debian packages of
# scripts/install-deps.sh; stage 2 installs only that .deb into a slim
# Debian 12, so apt pulls exactly the runtime libraries the binary links
# (the package's Depends come from dpkg-shlibdeps), and runs it as a
# non-root user. The CUDA backend is not built here (no CUDA toolkit in
# Debian 12's main archive); gpu.backend "auto" falls back to the host backend.

FROM debian:12 AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      build-essential cmake ninja-build pkg-config dpkg-dev file \
      libcaf-dev cppzmq-dev libzmq3-dev libmsgpack-cxx-dev libtomlplusplus-dev \
      doctest-dev libspdlog-dev libfmt-dev libxxhash-dev libcli11-dev \
      prometheus-cpp-dev libhiredis-dev libgrpc++-dev libprotobuf-dev protobuf-compiler \
      libsimdjson-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN rm -rf build-docker \
    && cmake -S . -B build-docker -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DKVSIDECAR_CUDA=OFF -DKVSIDECAR_BENCH=OFF \
    && cmake --build build-docker --target kvsidecar \
    && cd build-docker && cpack -G DEB -B /out

FROM debian:12-slim
# The .deb's Depends (dpkg-shlibdeps) bring the runtime libraries:
# libcaf-core, libzmq5, libspdlog1.10, libsimdjson14, ...
COPY --from=build /out/kvsidecar_*.deb /tmp/
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends /tmp/kvsidecar_*.deb \
    && rm -rf /var/lib/apt/lists/* /tmp/kvsidecar_*.deb \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin kvsidecar
USER 10001:10001
# 5555 cache (LMCache MP), 5600 events PUB, 5700 replay, 9090 /metrics and probes
EXPOSE 5555 5600 5700 9090
# No curl in the slim image: bash's /dev/tcp speaks the one HTTP request.
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9090 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/bin/kvsidecar"]
CMD ["--config", "/etc/kvsidecar/kvsidecar.toml"]
