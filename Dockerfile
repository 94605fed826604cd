# Multi-stage build of capdex: compile in the Rust image, run on slim Debian.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY src ./src
# Compiled in: config/capdex.toml (include_str!) and the static embedder's table and vocabulary
# (include_bytes!/include_str!); tests/it/compose_and_config.rs checks every such path is copied.
COPY config ./config
COPY assets ./assets
COPY benches ./benches
RUN cargo build --release --locked --bin capdex

FROM debian:bookworm-slim
RUN useradd --system --home /var/lib/capdex capdex && mkdir -p /var/lib/capdex /capabilities && chown capdex /var/lib/capdex
COPY --from=build /src/target/release/capdex /usr/local/bin/capdex
COPY config/capdex.toml /etc/capdex/capdex.toml
COPY examples/capabilities /capabilities
USER capdex
ENV CAPDEX_DATA_DIR=/var/lib/capdex CAPDEX_CAPABILITY_DIRS=/capabilities
# 9464: Prometheus /metrics (CAPDEX_METRICS_LISTEN_ADDR=0.0.0.0:9464 to listen beyond loopback).
EXPOSE 9464
ENTRYPOINT ["capdex"]
CMD ["serve"]
