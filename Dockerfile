# Build and run msgexchange (used by docker-compose.yml): the release binary, as sites run it.
# The build image has what librdkafka's bundled build needs (gcc, make, pkg-config, libssl-dev,
# zlib1g-dev). Every build is `--locked`: exactly the dependency versions of Cargo.lock.
#
# Base images are pinned by digest (tag kept for the reader): a rebuild gets the same bytes, not
# whatever the tag points to that day. The digests are the ones a BuildKit build resolved these
# tags to; refresh both together with `docker buildx imagetools inspect rust:1.95-bookworm` (and
# debian:bookworm-slim) when moving to a newer toolchain or for the base image's security fixes.
# tests/config_cli.rs (container_image_*) checks every FROM carries one.

# The runtime image's base, a stage of its own so that the build stage can read its package
# database for the SBOM (below). Its system packages are pinned by version: a rebuild installs
# the same ones or fails, never whatever the mirror holds that day. Debian's mirrors keep only
# the current version of each package of a release: when a security update replaces one, the
# build fails at this line; refresh the three versions together (`apt-cache policy
# ca-certificates libssl3 zlib1g` in the base image after `apt-get update`) and rebuild.
# tests/config_cli.rs (container_image_*) checks every package here carries a version.
FROM debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251 AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates=20250419~deb12u2 libssl3=3.0.22-1~deb12u2 zlib1g=1:1.2.13.dfsg-1+deb12u1 \
 && rm -rf /var/lib/apt/lists/*
# Never root: a system user with a fixed uid (runAsNonRoot in Kubernetes needs a numeric USER).
RUN groupadd --system --gid 10001 msgexchange \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin msgexchange

FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
# scripts/sbom.py (the image's SBOM, below) runs on python3: installed only where the base image
# lacks it. Setup before the first COPY is not part of the dependency layer's tree.
RUN command -v python3 >/dev/null \
 || (apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*)

# 1. The dependencies, in a layer of their own: rebuilt only when a manifest or Cargo.lock
#    changes, not on every source edit. The workspace's crates are empty stand-ins here (the
#    test targets actors/Cargo.toml names included, so the manifests load). Every workspace
#    member's manifest must be copied here, or cargo cannot load the workspace:
#    tests/config_cli.rs (container_image_dependency_layer_resolves) rebuilds this layer's tree
#    from these COPY lines and the stub RUN below and runs cargo on it.
COPY Cargo.toml Cargo.lock ./
COPY actors/Cargo.toml actors/
COPY bench/Cargo.toml bench/
COPY tests/common/Cargo.toml tests/common/
# The patched dependency (third_party/README.md), a real crate in this layer.
COPY third_party third_party/
RUN mkdir -p src actors/src bench/src tests/common \
 && touch src/lib.rs actors/src/lib.rs bench/src/lib.rs tests/common/mod.rs \
 && echo 'fn main() {}' > actors/src/main.rs \
 && echo 'fn main() {}' > bench/src/main.rs \
 && sed -n 's|^path = "\.\./\(tests/[a-z_]*\.rs\)"$|\1|p' actors/Cargo.toml | xargs -r touch
RUN cargo fetch --locked
RUN cargo build --release --locked --offline -p msgx-actors --bin msgexchange \
 && rm -rf src actors/src bench/src tests

# 2. Our code. COPY keeps the context's modification times, which may be older than the
#    stand-ins just built: touch the crate roots so cargo rebuilds both crates.
#    MSGX_FEATURES: empty for a site's image (no `dev` commands, like the Debian package);
#    docker-compose.yml's demo passes `dev-tools` (it runs `dev inbox-fixture` and the simulator).
#    The SBOM covers the image's system libraries too: the runtime stage's package database
#    (dpkg's status file) and its os-release, read by scripts/sbom.py.
COPY . .
ARG MSGX_FEATURES=""
COPY --from=runtime /var/lib/dpkg/status /usr/lib/os-release /runtime/
RUN touch src/lib.rs actors/src/lib.rs actors/src/main.rs \
 && cargo build --release --locked --offline -p msgx-actors --bin msgexchange --features "$MSGX_FEATURES" \
 && cp target/release/msgexchange /msgexchange \
 && python3 scripts/sbom.py --offline --dpkg-status /runtime/status --os-release /runtime/os-release \
      --out /msgexchange.cdx.json

FROM runtime
COPY --from=build /msgexchange /usr/local/bin/msgexchange
# The CycloneDX SBOM of this binary and the image's system packages (scripts/sbom.py; the Debian
# package ships the same crates, without the packages of this image).
COPY --from=build /msgexchange.cdx.json /usr/share/doc/msgexchange/sbom.cdx.json
# The docs book as HTML, built before `docker build` (`mdbook build docs` writes target/book,
# the one part of target/ .dockerignore lets in); the alerts' runbook_url falls back to it.
COPY target/book /usr/share/doc/msgexchange/html
# A site's configuration, not the development one (config/default.toml, shipped as the key
# reference only): TLS that verifies every server, the metrics listener on all interfaces (the
# EXPOSEd port), and no database or broker address — the site gives them (docs/operations.md
# "Container image"); `run` refuses to start without one, naming the key (exit 2).
COPY packaging/container.toml /etc/msgexchange/msgexchange.toml
COPY config/default.toml /usr/share/doc/msgexchange/default.toml
ENV MSGEXCHANGE_CONFIG=/etc/msgexchange/msgexchange.toml
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
