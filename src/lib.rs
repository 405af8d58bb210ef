//! msgexchange core: *what* the service does. Pure decision rules and the store adapters; no
//! actors here (they live in `msgx-actors`: *when* things happen).
//!
//! - [`watermark`]: the contiguous-watermark and hole-aging rule (pure).
//! - [`cutover`]: one-time cutover seeding modes (pure).
//! - [`poller`]: one discovery round over the adapters.
//! - [`inbox`]: the shared MySQL inbox adapter (read + mark columns only).
//! - [`store`]: our PostgreSQL (migrations, cursor, queue).
//! - [`settings`]: configuration, validated at start.
//! - [`telemetry`]: every metric name and its log line.
//! - [`clock`]: the injectable clock.
//! - [`devtools`]: acting as the DB owner and as upstream, for dev, tests and benchmarks.

pub mod clock;
pub mod cutover;
pub mod devtools;
pub mod inbox;
pub mod poller;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod watermark;
