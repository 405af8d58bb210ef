//! `kafka.brokers = "embedded"`: librdkafka's mock cluster, a real Kafka-protocol broker
//! inside this process. For the demo and a newcomer's first run, and for tests: nothing it
//! holds survives the process.
//!
//! `MockCluster` is not `Send`, so it lives on its own thread for as long as the
//! [`EmbeddedCluster`] handle does; only its bootstrap address leaves that thread.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::mocking::MockCluster;

use super::ProducerError;

/// Topics created up front (partitions), so the mock broker behaves like a configured one.
const PARTITIONS: i32 = 3;

/// What the cluster's thread is asked to do; the handle dropping its sender stops it.
enum Command {
    /// Delay every broker's responses by this much, then answer.
    RoundTrip(Duration, mpsc::Sender<Result<(), String>>),
}

/// A running in-process mock cluster; dropping it stops the cluster.
pub struct EmbeddedCluster {
    bootstrap: String,
    commands: Option<mpsc::Sender<Command>>,
    thread: Option<JoinHandle<()>>,
}

impl EmbeddedCluster {
    /// Starts a mock cluster with `brokers` brokers and the given topics.
    pub fn start(brokers: i32, topics: &[&str]) -> Result<Self, ProducerError> {
        let topics: Vec<String> = topics.iter().map(|t| t.to_string()).collect();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<String, String>>();
        let (commands, command_rx) = mpsc::channel::<Command>();
        let thread = std::thread::Builder::new()
            .name("kafka-mock".into())
            .spawn(move || {
                let cluster = match MockCluster::new(brokers) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                for t in &topics {
                    if let Err(e) = cluster.create_topic(t, PARTITIONS, brokers.min(3)) {
                        let _ = ready_tx.send(Err(format!("create topic {t}: {e}")));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                // Until the handle is dropped: then the cluster drops here.
                while let Ok(Command::RoundTrip(rtt, answer)) = command_rx.recv() {
                    let set = (1..=brokers)
                        .try_for_each(|b| cluster.broker_round_trip_time(b, rtt))
                        .map_err(|e| e.to_string());
                    let _ = answer.send(set);
                }
                drop(cluster);
            })
            .map_err(|e| ProducerError::Embedded(e.to_string()))?;
        let bootstrap = ready_rx
            .recv()
            .map_err(|_| ProducerError::Embedded("mock cluster thread ended".into()))?
            .map_err(ProducerError::Embedded)?;
        tracing::warn!(
            bootstrap = %bootstrap,
            "kafka.brokers = embedded: events go to an IN-PROCESS MOCK CLUSTER and are LOST when \
             the process ends; set kafka.brokers to real brokers for anything but a demo"
        );
        Ok(Self {
            bootstrap,
            commands: Some(commands),
            thread: Some(thread),
        })
    }

    /// The mock brokers' `host:port` list.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Delays every broker's responses by `rtt` from now on: a broker farther away than
    /// this process, for benchmarks (`msgx-bench e2e --broker-rtt`).
    pub fn set_round_trip_time(&self, rtt: Duration) -> Result<(), ProducerError> {
        let ended = || ProducerError::Embedded("mock cluster thread ended".into());
        let (answer, answered) = mpsc::channel();
        self.commands
            .as_ref()
            .ok_or_else(ended)?
            .send(Command::RoundTrip(rtt, answer))
            .map_err(|_| ended())?;
        answered
            .recv()
            .map_err(|_| ended())?
            .map_err(ProducerError::Embedded)
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        drop(self.commands.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
