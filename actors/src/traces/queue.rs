//! The export queue between the spans and the collector: bounded, never blocking. A span that
//! ends while the queue is full is dropped and counted (`msgx_trace_spans_dropped_total`), so a
//! dead or slow collector costs the pipeline nothing but the spans. One thread sends the
//! batches (every `export_interval`, or as soon as a batch is full); a failed request drops its
//! batch (counted) rather than retrying into a growing backlog.
//!
//! Not the SDK's `BatchSpanProcessor`: that one drops silently (its count is only logged at
//! shutdown), and the drops are what an operator must see. Its memory grows with the spans
//! waiting, not with `queue_size` (a `VecDeque`, not a preallocated channel).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use msgx_core::telemetry;
use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

/// The attribute that marks a span not to export (a unit of work that found none).
pub const IDLE: &str = "msgx.idle";

/// The queue's limits.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Most spans waiting.
    pub capacity: usize,
    /// Most spans per export request.
    pub batch: usize,
    /// Longest wait before a partial batch is sent.
    pub interval: Duration,
}

#[derive(Debug, Default)]
struct State {
    spans: VecDeque<SpanData>,
    shutdown: bool,
    /// Flush requests asked and answered (a flush waits until its number is answered).
    flush_asked: u64,
    flush_done: u64,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// The worker waits here for spans, a flush or the shutdown.
    wake: Condvar,
    /// Flushes and the shutdown wait here for the worker.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a queue that is still consistent (every
        // change to it is one call), so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The span processor: queues finished, sampled spans for the export thread.
#[derive(Debug)]
pub struct BoundedQueue {
    shared: Arc<Shared>,
    limits: QueueLimits,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl BoundedQueue {
    /// Starts the export thread over `exporter` (its resource already set).
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        limits: QueueLimits,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let worker = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("msgx-trace-export".into())
                .spawn(move || export_loop(&shared, exporter, limits))?
        };
        Ok(Self {
            shared,
            limits,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Spans waiting now.
    pub fn len(&self) -> usize {
        self.shared.lock().spans.len()
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits (at most `timeout`) until the worker answered flush request `asked`, or stopped.
    fn wait_for(&self, asked: u64, timeout: Duration) -> OTelSdkResult {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while st.flush_done < asked {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(OTelSdkError::Timeout(timeout));
            }
            st = self
                .shared
                .done
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    fn ask_flush(&self, shutdown: bool) -> u64 {
        let mut st = self.shared.lock();
        st.flush_asked += 1;
        st.shutdown |= shutdown;
        let asked = st.flush_asked;
        drop(st);
        self.shared.wake.notify_one();
        asked
    }
}

impl SpanProcessor for BoundedQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        // `msgx.idle`: a unit of work that found nothing to do (an idle pump poll) is not worth
        // a span in the collector.
        let idle = || {
            span.attributes
                .iter()
                .any(|kv| kv.key.as_str() == IDLE && kv.value == opentelemetry::Value::Bool(true))
        };
        if !span.span_context.is_sampled() || idle() {
            return;
        }
        let mut st = self.shared.lock();
        if st.shutdown || st.spans.len() >= self.limits.capacity {
            drop(st);
            telemetry::trace_span_dropped_queue_full();
            return;
        }
        st.spans.push_back(span);
        let full_batch = st.spans.len() >= self.limits.batch;
        drop(st);
        if full_batch {
            self.shared.wake.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        let asked = self.ask_flush(false);
        self.wait_for(asked, Duration::from_secs(30))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let asked = self.ask_flush(true);
        let result = self.wait_for(asked, timeout);
        if result.is_ok() {
            let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(w) = worker {
                // It answered the last flush and is leaving its loop: the join is immediate.
                let _ = w.join();
            }
        }
        result
    }
}

/// The export thread: a batch when one is full, the interval passed, or a flush or the
/// shutdown asks; every span of a flush is sent before it is answered.
fn export_loop<E: SpanExporter>(shared: &Shared, exporter: E, limits: QueueLimits) {
    let mut last = Instant::now();
    let mut failing = 0u64;
    loop {
        let mut st = shared.lock();
        loop {
            let asked = st.flush_asked > st.flush_done;
            if st.shutdown || asked || st.spans.len() >= limits.batch {
                break;
            }
            let left = limits.interval.saturating_sub(last.elapsed());
            if left.is_zero() {
                break;
            }
            st = shared
                .wake
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let take = st.spans.len().min(limits.batch);
        let batch: Vec<SpanData> = st.spans.drain(..take).collect();
        let (left, asked) = (st.spans.len(), st.flush_asked);
        drop(st);
        last = Instant::now();
        if !batch.is_empty() {
            let n = batch.len();
            match futures::executor::block_on(exporter.export(batch)) {
                Ok(()) => {
                    if failing > 0 {
                        telemetry::trace_export_recovered(failing);
                    }
                    failing = 0;
                    telemetry::trace_spans_exported(n, left);
                }
                Err(e) => {
                    telemetry::trace_export_failed(n, left, &e.to_string(), failing == 0);
                    failing += 1;
                }
            }
        }
        let mut st = shared.lock();
        if st.spans.is_empty() {
            // Everything queued before the requests went out (or was dropped): answer them.
            st.flush_done = asked;
            shared.done.notify_all();
            if st.shutdown {
                return;
            }
        }
    }
}
