//! Which store failures are an outage — the store unreachable, the connection broken, no
//! answer in time — rather than a fault of the statement or of the row it touched. SPEC §4: a
//! timeout or connection error on any store is FAILED(INFRA) with backoff; the pump does not
//! charge such a failure to the message at the head (docs/operations.md, "A store outage and
//! the head").

/// True when `e` says the store could not be reached or the connection broke: I/O, TLS, a
/// broken protocol stream, the pool (no connection in time, closed), or a database error of
/// SQLSTATE class 08 (connection exception; MariaDB's "server shutdown" too), 53 (insufficient
/// resources: too many connections) or 57P0x (PostgreSQL shutting down). A statement error (a
/// trigger, a constraint, a column that does not decode) may be caused by one row: not an
/// outage.
pub fn is_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("53") || c.starts_with("57P0")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_outages_row_errors_are_not() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(is_outage(&sqlx::Error::Io(reset)));
        assert!(is_outage(&sqlx::Error::PoolTimedOut));
        assert!(is_outage(&sqlx::Error::Protocol("eof mid-packet".into())));
        assert!(!is_outage(&sqlx::Error::RowNotFound));
        assert!(!is_outage(&sqlx::Error::ColumnDecode {
            index: "2".into(),
            source: "invalid utf-8".into(),
        }));
    }
}
