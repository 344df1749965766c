# The broker's container image: `docker build -t approval-broker .` at the repository root.
#
# Dependencies are built in a layer of their own (cargo-chef), so a change to the broker's source
# rebuilds only the broker. The protos are compiled by protox inside build.rs: no protoc.
# The runtime image is distroless (glibc and CA certificates, no shell), running as the numeric
# user 65532, with its state under /data. CI lints this file with hadolint (.ci/deploy-check);
# it has no Docker engine, so it does not build the image.

# The builder and the runtime are both Debian 12 (bookworm), so the binary links against the
# same glibc it runs with.
FROM rust:1.95.0-slim-bookworm AS chef
WORKDIR /build
RUN cargo install cargo-chef --locked --version 0.1.78

# The recipe: Cargo.toml and Cargo.lock reduced to what the dependencies depend on.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /build/recipe.json recipe.json
# The build settings (SQLite's compile flags) before the dependencies are built with them.
COPY .cargo .cargo
# Rebuilt only when the recipe changes.
RUN cargo chef cook --release --locked --bin approval-broker --recipe-path recipe.json
COPY . .
# /out/data is an empty directory: the runtime stage has no shell to create /data with.
RUN cargo build --release --locked --bin approval-broker \
    && mkdir -p /out/data

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /build/target/release/approval-broker /usr/local/bin/approval-broker
COPY --from=builder --chown=65532:65532 /out/data /data
# In a container the broker must listen beyond loopback; the database is the volume's file.
# Every setting can be overridden with its environment variable or flag (docs/configuration.md).
ENV APPROVALS_LISTEN=0.0.0.0:50051 \
    APPROVALS_METRICS_LISTEN=0.0.0.0:9464 \
    DATABASE_URL=sqlite:///data/approvals.db
WORKDIR /data
USER 65532:65532
VOLUME ["/data"]
# 50051: gRPC (plaintext unless APPROVALS_TLS_CERT is set); 9464: Prometheus metrics.
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/approval-broker"]
