# syntax=docker/dockerfile:1
# skyport-simulator: the five simulated backend services on 7070 (point a
# worker's services.base_url at http://HOST:7070). Flags: --listen, and the
# [simulator] keys (--set simulator.latency_ms=20, or SKYPORT__SIMULATOR__…).
# Build from the repository root (the context is the workspace):
#   DOCKER_BUILDKIT=1 docker build -f docker/simulator.Dockerfile -t skyport-simulator:0.1.0 .

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The cargo registry and the target directory are cache mounts (shared by the
# four images), so the binary is copied out of the mount to /out.
RUN --mount=type=cache,id=skyport-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=skyport-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=skyport-target,target=/src/target \
    cargo build --release --locked -p skyport --bin skyport-simulator \
    && install -D -m 0755 target/release/skyport-simulator /out/skyport-simulator

# glibc and libgcc of Debian 12 (the builder's), no shell; uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/skyport-simulator /usr/local/bin/skyport-simulator
USER 65532:65532
EXPOSE 7070
ENTRYPOINT ["/usr/local/bin/skyport-simulator"]
# Arguments given to `docker run IMAGE …` replace these.
CMD ["--listen", "0.0.0.0:7070"]
