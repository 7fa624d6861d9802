# syntax=docker/dockerfile:1
# skyport-gateway: the gateway alone, for deployments on a shared stream and
# store (profile azure). Serves /healthz, /readyz, /metrics and /api on 8080.
# Build from the repository root (the context is the workspace):
#   DOCKER_BUILDKIT=1 docker build -f docker/gateway.Dockerfile -t skyport-gateway:0.1.0 .

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The cargo registry and the target directory are cache mounts (shared by the
# four images), so the binary is copied out of the mount to /out.
RUN --mount=type=cache,id=skyport-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=skyport-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=skyport-target,target=/src/target \
    cargo build --release --locked -p skyport --bin skyport-gateway \
    && install -D -m 0755 target/release/skyport-gateway /out/skyport-gateway

# glibc and libgcc of Debian 12 (the builder's) and its CA certificates, no shell;
# OpenSSL is built into the binary. uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/skyport-gateway /usr/local/bin/skyport-gateway
USER 65532:65532
# Environment variables win over a --config file; the Helm chart's config says the same.
ENV SKYPORT__GATEWAY__LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/skyport-gateway"]
