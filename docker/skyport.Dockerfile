# syntax=docker/dockerfile:1
# skyport: the all-in-one (gateway, worker and simulated services in one
# process) on the embedded store in /data. Serves /healthz, /readyz, /metrics
# and /api on 8080. One process owns the data: run one container per volume.
# Build from the repository root (the context is the workspace):
#   DOCKER_BUILDKIT=1 docker build -f docker/skyport.Dockerfile -t skyport:0.1.0 .
#   docker run -p 8080:8080 -v skyport-data:/data skyport:0.1.0

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The cargo registry and the target directory are cache mounts (shared by the
# four images), so the binary is copied out of the mount to /out. /out/data
# becomes /data, owned by the runtime user so a new volume is writable.
RUN --mount=type=cache,id=skyport-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=skyport-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=skyport-target,target=/src/target \
    cargo build --release --locked -p skyport --bin skyport \
    && install -D -m 0755 target/release/skyport /out/skyport \
    && install -d -m 0750 /out/data

# glibc and libgcc of Debian 12 (the builder's) and its CA certificates, no shell;
# OpenSSL is built into the binary. uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/skyport /usr/local/bin/skyport
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# Environment variables win over a --config file; the Helm chart's config says the same.
ENV SKYPORT__GATEWAY__LISTEN=0.0.0.0:8080 \
    SKYPORT__EMBEDDED__DATA_DIR=/data
VOLUME /data
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/skyport"]
