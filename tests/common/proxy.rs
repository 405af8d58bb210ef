//! A tiny TCP proxy for cutting a store's connection mid-test: every accepted connection is
//! piped to the target until `cut()`, which drops all live connections and refuses new ones
//! until `restore()`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy.
pub struct Proxy {
    /// Local port to connect to instead of the target.
    pub port: u16,
    up: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
}

impl Proxy {
    /// Starts a proxy to `target` (e.g. "127.0.0.1:3306").
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = watch::channel(0u64);
        let target = target.to_string();
        let (up2, gen2) = (up.clone(), generation.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    drop(client); // refused: the peer sees a closed connection
                    continue;
                }
                let target = target.clone();
                let mut cut = gen2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self {
            port,
            up,
            generation,
        }
    }

    /// Drops every live connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}
