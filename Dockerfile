# Build and run msgexchange (used by docker-compose.yml): the release binary, as sites run it.
# The build image has what librdkafka's bundled build needs (gcc, make, pkg-config, libssl-dev,
# zlib1g-dev). Every build is `--locked`: exactly the dependency versions of Cargo.lock.
FROM rust:1.95-bookworm AS build
WORKDIR /src

# 1. The dependencies, in a layer of their own: rebuilt only when a manifest or Cargo.lock
#    changes, not on every source edit. The workspace's crates are empty stand-ins here (the
#    test targets actors/Cargo.toml names included, so the manifests load).
COPY Cargo.toml Cargo.lock ./
COPY actors/Cargo.toml actors/
COPY bench/Cargo.toml bench/
# The patched dependency (third_party/README.md), a real crate in this layer.
COPY third_party third_party/
RUN mkdir -p src actors/src bench/src tests \
 && touch src/lib.rs actors/src/lib.rs bench/src/lib.rs \
 && echo 'fn main() {}' > actors/src/main.rs \
 && echo 'fn main() {}' > bench/src/main.rs \
 && sed -n 's|^path = "\.\./\(tests/[a-z_]*\.rs\)"$|\1|p' actors/Cargo.toml | xargs -r touch \
 && cargo build --release --locked -p msgx-actors --bin msgexchange \
 && rm -rf src actors/src bench/src tests

# 2. Our code. COPY keeps the context's modification times, which may be older than the
#    stand-ins just built: touch the crate roots so cargo rebuilds both crates.
COPY . .
RUN touch src/lib.rs actors/src/lib.rs actors/src/main.rs \
 && cargo build --release --locked -p msgx-actors --bin msgexchange \
 && cp target/release/msgexchange /msgexchange

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g && rm -rf /var/lib/apt/lists/*
# Never root: a system user with a fixed uid (runAsNonRoot in Kubernetes needs a numeric USER).
RUN groupadd --system --gid 10001 msgexchange \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin msgexchange
COPY --from=build /msgexchange /usr/local/bin/msgexchange
COPY config /etc/msgexchange
ENV MSGEXCHANGE_CONFIG=/etc/msgexchange/default.toml
USER 10001:10001
EXPOSE 9464
# Liveness, not readiness: /healthz answers 200 while the process serves (a standby waiting
# for the lease is healthy; /readyz is 503 for it). No curl in the image: bash's /dev/tcp, on
# the default http.listen port (change both together).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q ' 200 ' <&3"]
# SIGTERM starts the graceful shutdown (supervisor.shutdown_grace + the HTTP drain): give it
# `docker stop -t 30` / compose stop_grace_period 30s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["msgexchange"]
CMD ["run"]
