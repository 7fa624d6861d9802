# syntax=docker/dockerfile:1
# skyport-worker: the worker alone, for deployments on a shared stream and
# store (profile azure); needs services.base_url. Serves /healthz, /readyz and
# /metrics on 9090.
# Build from the repository root (the context is the workspace):
#   DOCKER_BUILDKIT=1 docker build -f docker/worker.Dockerfile -t skyport-worker:0.1.0 .

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The cargo registry and the target directory are cache mounts (shared by the
# four images), so the binary is copied out of the mount to /out.
RUN --mount=type=cache,id=skyport-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=skyport-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=skyport-target,target=/src/target \
    cargo build --release --locked -p skyport --bin skyport-worker \
    && install -D -m 0755 target/release/skyport-worker /out/skyport-worker

# glibc and libgcc of Debian 12 (the builder's) and its CA certificates, no shell;
# OpenSSL is built into the binary. uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/skyport-worker /usr/local/bin/skyport-worker
USER 65532:65532
# Environment variables win over a --config file; the Helm chart's config says the same.
ENV SKYPORT__WORKER__LISTEN=0.0.0.0:9090
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/skyport-worker"]
