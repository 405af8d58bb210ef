# Build and run msgexchange (used by docker-compose.yml): the release binary, as sites run it.
# The build image has what librdkafka's bundled build needs (gcc, make, pkg-config, libssl-dev,
# zlib1g-dev).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p msgx-actors --bin msgexchange && cp target/release/msgexchange /msgexchange

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g && rm -rf /var/lib/apt/lists/*
COPY --from=build /msgexchange /usr/local/bin/msgexchange
COPY config /etc/msgexchange
ENV MSGEXCHANGE_CONFIG=/etc/msgexchange/default.toml
ENTRYPOINT ["msgexchange"]
CMD ["run"]
