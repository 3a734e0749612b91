# ojs-jetstream container image: a release build on Debian bookworm, run as a non-root user.
# Settings: config/ojs-jetstream.toml (in the working directory /app) overridden by OJS_*
# environment variables; at least OJS_NATS_URL is usually needed.

FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
# --locked: the image is built from exactly the dependency versions in Cargo.lock.
RUN cargo build --release --locked --bin ojs-jetstream

FROM debian:bookworm-slim
# ca-certificates: for TLS connections to NATS (tls:// URLs).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /app --shell /usr/sbin/nologin ojs
COPY --from=builder /src/target/release/ojs-jetstream /usr/local/bin/ojs-jetstream
WORKDIR /app
COPY config/ /app/config/
USER ojs
# The gateway keeps no local state (everything lives in JetStream); it only has to be
# reachable from outside the container.
ENV OJS_LISTEN=0.0.0.0:8080
EXPOSE 8080
CMD ["ojs-jetstream", "serve"]
