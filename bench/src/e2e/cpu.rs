//! CPU used during the drain, by process: this one (the service: every actor, the Kafka
//! client, the embedded broker), the local PostgreSQL and the local MariaDB/MySQL server. It
//! tells a pipeline short of CPU (both cores busy: the stages take turns) from one that waits
//! on round trips. Read from `/proc` (Linux, servers on this host); elsewhere nothing prints.

use std::time::Duration;

/// Cumulative CPU seconds (user + system) at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CpuTimes {
    /// This process.
    service: f64,
    /// Every `postgres` process, with the finished backends the postmaster reaped.
    postgres: f64,
    /// `mariadbd` or `mysqld`.
    mysql: f64,
    /// The whole host (`/proc/stat`): busy, and waiting for I/O or stolen by the hypervisor.
    host_busy: f64,
    host_wait: f64,
}

/// `(comm, user + system [+ reaped children], in clock ticks)` of one `/proc/<pid>/stat`.
fn stat(path: &str, children: bool) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let (head, rest) = text.rsplit_once(") ")?;
    let comm = head.split_once(" (")?.1.to_string();
    // After the comm: state is field 3, utime 14, stime 15, cutime 16, cstime 17.
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|v| v.parse().ok())
        .collect();
    let own = f.first()? + f.get(1)?;
    let reaped = if children { f.get(2)? + f.get(3)? } else { 0 };
    Some((comm, own + reaped))
}

impl CpuTimes {
    /// Now; `None` without `/proc`.
    pub(super) fn now() -> Option<Self> {
        // Linux's USER_HZ: 100 on every architecture it supports.
        const TICK: f64 = 0.01;
        let (_, own) = stat("/proc/self/stat", false)?;
        let mut t = CpuTimes {
            service: own as f64 * TICK,
            ..Self::default()
        };
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let Some((comm, ticks)) = stat(&format!("/proc/{pid}/stat"), true) else {
                continue;
            };
            match comm.as_str() {
                "postgres" => t.postgres += ticks as f64 * TICK,
                "mariadbd" | "mysqld" => t.mysql += ticks as f64 * TICK,
                _ => {}
            }
        }
        let host = std::fs::read_to_string("/proc/stat").ok()?;
        // cpu  user nice system idle iowait irq softirq steal ...
        let f: Vec<f64> = host
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0.0) * TICK;
        t.host_busy = at(0) + at(1) + at(2) + at(5) + at(6);
        t.host_wait = at(4) + at(7);
        Some(t)
    }
}

/// Prints each process's share of the cores over the drain (`wall`) and the host's cores.
pub(super) fn print(before: Option<CpuTimes>, after: Option<CpuTimes>, wall: Duration) {
    let (Some(b), Some(a)) = (before, after) else {
        return;
    };
    let secs = wall.as_secs_f64().max(1e-9);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let used = |x: f64, y: f64| (y - x).max(0.0) / secs;
    let (service, pg, my) = (
        used(b.service, a.service),
        used(b.postgres, a.postgres),
        used(b.mysql, a.mysql),
    );
    println!(
        "  cpu over the drain    : {:.2} of {cores} cores busy — service {service:.2}, PostgreSQL {pg:.2}, MariaDB {my:.2}; the host {:.2} busy, {:.2} in I/O wait or stolen (/proc)",
        service + pg + my,
        used(b.host_busy, a.host_busy),
        used(b.host_wait, a.host_wait)
    );
}
