//! Inbox table and column names come from config (the DB owner's contract), so inbox SQL is
//! built at run time. Names are checked to be plain identifiers and always back-quoted: a
//! config value can never inject SQL.

/// A validated, back-quoted MySQL identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident(String);

impl Ident {
    /// Accepts `[A-Za-z_][A-Za-z0-9_$]{0,63}`; the error names the config key.
    pub fn new(raw: &str, key: &'static str) -> Result<Self, (&'static str, String)> {
        let ok = !raw.is_empty()
            && raw.len() <= 64
            && raw.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && raw
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
        if ok {
            Ok(Self(raw.to_string()))
        } else {
            Err((
                key,
                format!("`{raw}` is not a plain identifier ([A-Za-z_][A-Za-z0-9_$]*, ≤ 64)"),
            ))
        }
    }

    /// The bare name, e.g. for messages.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Ident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`", self.0)
    }
}

/// The inbound inbox table and its columns.
#[derive(Debug, Clone)]
pub struct InboxNames {
    /// Table, default `CMINMSGS`.
    pub table: Ident,
    /// Auto-increment id.
    pub id: Ident,
    /// Receive time (DATETIME, nullable).
    pub received: Ident,
    /// Raw message text.
    pub message: Ident,
    /// Processed-time mark.
    pub processed: Ident,
    /// Processed-status mark.
    pub status: Ident,
}

impl InboxNames {
    /// Validates every name.
    pub fn new(
        table: &str,
        id: &str,
        received: &str,
        message: &str,
        processed: &str,
        status: &str,
    ) -> Result<Self, (&'static str, String)> {
        Ok(Self {
            table: Ident::new(table, "inbox.table")?,
            id: Ident::new(id, "inbox.id_column")?,
            received: Ident::new(received, "inbox.received_column")?,
            message: Ident::new(message, "inbox.message_column")?,
            processed: Ident::new(processed, "inbox.processed_column")?,
            status: Ident::new(status, "inbox.status_column")?,
        })
    }

    /// The defaults of SPEC §12.
    pub fn defaults() -> Self {
        Self::new(
            "CMINMSGS",
            "CMINMSGS_ID",
            "CMINMSGS_DATE_RECEIVED",
            "CMINMSGS_CLOB_MSG",
            "CMINMSGS_DATE_PROCESSED",
            "CMINMSGS_STATUS",
        )
        .unwrap_or_else(|_| unreachable!("default names are valid identifiers"))
    }

    /// `template` with `{table}`, `{id}`, `{received}`, `{message}`, `{processed}` and
    /// `{status}` replaced by the quoted names: every inbox statement spells a name the same
    /// way. The names are plain identifiers, so a replacement never forms another placeholder.
    pub fn sql(&self, template: &str) -> String {
        [
            ("{table}", &self.table),
            ("{id}", &self.id),
            ("{received}", &self.received),
            ("{message}", &self.message),
            ("{processed}", &self.processed),
            ("{status}", &self.status),
        ]
        .into_iter()
        .fold(template.to_string(), |sql, (key, name)| {
            sql.replace(key, &name.to_string())
        })
    }
}

/// The outbound table (SPEC §12): we insert rows (writing only `created` and `message`; the
/// id is auto-increment), never alter it. The downstream adapter's columns (`*_DATE_SENT`,
/// `*_ACK_*`, `*_ERROR`) are not ours: never written.
#[derive(Debug, Clone)]
pub struct OutboxNames {
    /// Table, default `COUTMSGS`.
    pub table: Ident,
    /// Auto-increment id, default `<table>_ID`.
    pub id: Ident,
    /// Creation time we write (DATETIME, airport local time), default `<table>_DATE_CREATED`.
    pub created: Ident,
    /// Message text we write, default `<table>_CLOB_MSG`.
    pub message: Ident,
}

impl OutboxNames {
    /// Validates the table name; the columns are `<table>_ID`, `<table>_DATE_CREATED` and
    /// `<table>_CLOB_MSG` (SPEC §12).
    pub fn new(table: &str) -> Result<Self, (&'static str, String)> {
        Self::with_columns(
            table,
            &format!("{table}_ID"),
            &format!("{table}_DATE_CREATED"),
            &format!("{table}_CLOB_MSG"),
        )
        .map_err(|(_, reason)| ("inbox.out_table", reason))
    }

    /// Validates the table and our three column names (config `outbound.*_column`).
    pub fn with_columns(
        table: &str,
        id: &str,
        created: &str,
        message: &str,
    ) -> Result<Self, (&'static str, String)> {
        Ok(Self {
            table: Ident::new(table, "inbox.out_table")?,
            id: Ident::new(id, "outbound.id_column")?,
            created: Ident::new(created, "outbound.created_column")?,
            message: Ident::new(message, "outbound.message_column")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_plain_and_quoted() {
        assert_eq!(
            Ident::new("CMINMSGS", "k").expect("ok").to_string(),
            "`CMINMSGS`"
        );
        assert!(Ident::new("a`b", "k").is_err());
        assert!(Ident::new("x; DROP TABLE y", "k").is_err());
        assert!(Ident::new("", "k").is_err());
        assert!(Ident::new("1abc", "k").is_err());
        assert!(Ident::new(&"a".repeat(65), "k").is_err());
        let (key, _) = Ident::new("bad name", "inbox.table").expect_err("bad");
        assert_eq!(key, "inbox.table");
    }

    #[test]
    fn outbound_columns_default_from_the_table_or_are_named() {
        let n = OutboxNames::new("COUTMSGS").expect("ok");
        assert_eq!(n.id.as_str(), "COUTMSGS_ID");
        assert_eq!(n.created.as_str(), "COUTMSGS_DATE_CREATED");
        assert_eq!(n.message.as_str(), "COUTMSGS_CLOB_MSG");
        let (key, _) = OutboxNames::new("C`x").expect_err("bad");
        assert_eq!(key, "inbox.out_table");
        let (key, _) = OutboxNames::with_columns("OUT", "ID", "CREATED", "MSG;").expect_err("bad");
        assert_eq!(key, "outbound.message_column");
    }
}
