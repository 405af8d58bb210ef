//! `msgexchange check-config --probe`: connects with the configured accounts and says, per
//! store, which privileges the service needs and lacks, and which the account holds beyond
//! them (docs/operations.md, "Database accounts"): MySQL grants through roles and `GRANT
//! OPTION` too, PostgreSQL's predefined roles and the rights on the append-only `audit_log`. One line each; a needed privilege missing
//! is a refusal (exit 2: a restart cannot grant it).

use anyhow::Context as _;
use msgx_core::settings::Settings;
use sqlx::{Connection as _, MySqlConnection, PgConnection};

/// What the probe found for one store.
#[derive(Debug, Default)]
pub struct Findings {
    /// Needed and not held: the service fails (or `late.hole_evidence` falls back).
    pub missing: Vec<String>,
    /// Held and not needed: what a leaked password would give beyond the service's needs.
    pub excess: Vec<String>,
}

/// Runs both probes and prints one line per finding; Err (exit 2) when a needed privilege is
/// missing, Err (exit 1) when a store could not be reached.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let inbox = probe_inbox(settings).await;
    let store = probe_store(settings).await;
    let mut missing = 0;
    let mut unreachable = Vec::new();
    for (name, found) in [("inbox", inbox), ("store", store)] {
        match found {
            Ok(f) => {
                for m in &f.missing {
                    println!("{name}: missing: {m}");
                }
                for x in &f.excess {
                    println!("{name}: more than needed: {x}");
                }
                if f.missing.is_empty() && f.excess.is_empty() {
                    println!("{name}: privileges as documented (nothing missing, nothing more)");
                }
                missing += f.missing.len();
            }
            Err(e) => {
                let line = crate::refusal::error_line(&e);
                println!("{name}: not probed: {line}");
                unreachable.push(name);
            }
        }
    }
    if missing > 0 {
        return Err(crate::refusal::Refusal::config(format!(
            "{missing} needed database privilege(s) missing (docs/operations.md, \"Database accounts\")"
        ))
        .into());
    }
    if !unreachable.is_empty() {
        anyhow::bail!("could not probe: {}", unreachable.join(", "));
    }
    Ok(())
}

/// One privilege the MySQL account holds: `level` is global, schema, table or column.
struct Grant {
    level: &'static str,
    table: String,
    column: String,
    privilege: String,
}

/// The current account's grantee as information_schema spells it: `'user'@'host'`.
const GRANTEE: &str = "SELECT CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', \
     SUBSTRING_INDEX(CURRENT_USER(), '@', -1), ''''), DATABASE()";

/// Its own grants at every level that reaches the inbox database, each with whether it may
/// pass it on (`IS_GRANTABLE`); grants through roles are read by [`crate::probe_roles`].
const GRANTS: &str = "\
    SELECT 'global', '', '', PRIVILEGE_TYPE, IS_GRANTABLE \
      FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = ? \
    UNION ALL SELECT 'schema', '', '', PRIVILEGE_TYPE, IS_GRANTABLE \
      FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE = ? AND ? LIKE TABLE_SCHEMA \
    UNION ALL SELECT 'table', TABLE_NAME, '', PRIVILEGE_TYPE, IS_GRANTABLE \
      FROM information_schema.TABLE_PRIVILEGES WHERE GRANTEE = ? AND TABLE_SCHEMA = ? \
    UNION ALL SELECT 'column', TABLE_NAME, COLUMN_NAME, PRIVILEGE_TYPE, IS_GRANTABLE \
      FROM information_schema.COLUMN_PRIVILEGES WHERE GRANTEE = ? AND TABLE_SCHEMA = ?";

/// The roles active in this session (default roles at login, and the roles they hold).
const ENABLED_ROLES: &str = "SELECT ROLE_NAME FROM information_schema.ENABLED_ROLES";

async fn probe_inbox(settings: &Settings) -> anyhow::Result<Findings> {
    let options = msgx_core::inbox::connect_options(&settings.inbox)?;
    let mut conn = MySqlConnection::connect_with(&options)
        .await
        .context("connecting to the inbox")?;
    let (grantee, db): (String, Option<String>) = sqlx::query_as(GRANTEE)
        .fetch_one(&mut conn)
        .await
        .context("reading the inbox account")?;
    let db = db.unwrap_or_default();
    let rows: Vec<(String, String, String, String, String)> = sqlx::query_as(GRANTS)
        .bind(&grantee)
        .bind(&grantee)
        .bind(&db)
        .bind(&grantee)
        .bind(&db)
        .bind(&grantee)
        .bind(&db)
        .fetch_all(&mut conn)
        .await
        .context("reading the inbox account's grants")?;
    let (through_roles, inactive) = read_role_grants(&mut conn, &grantee, &db).await?;
    let _ = conn.close().await;
    let mut grants = Vec::new();
    for (level, table, column, privilege, grantable) in rows {
        let level = match level.as_str() {
            "global" => "global",
            "schema" => "schema",
            "table" => "table",
            _ => "column",
        };
        if grantable.eq_ignore_ascii_case("YES") {
            grants.push(Grant {
                level,
                table: table.clone(),
                column: column.clone(),
                privilege: "GRANT OPTION".into(),
            });
        }
        grants.push(Grant {
            level,
            table,
            column,
            privilege,
        });
    }
    grants.extend(through_roles.into_iter().map(|g| Grant {
        level: g.level,
        table: g.table,
        column: g.column,
        privilege: g.privilege,
    }));
    let mut found = judge_inbox(settings, &db, &grants);
    for role in inactive {
        found.excess.push(format!(
            "role `{role}` (granted, not active at login: its privileges were not read, and \
             this password can SET ROLE to it)"
        ));
    }
    Ok(found)
}

/// The grants of the account's active roles and the roles granted but not active
/// ([`crate::probe_roles`]), from `SHOW GRANTS` (never printed: it carries a password hash).
async fn read_role_grants(
    conn: &mut MySqlConnection,
    grantee: &str,
    db: &str,
) -> anyhow::Result<(Vec<crate::probe_roles::RoleGrant>, Vec<String>)> {
    use sqlx::Row as _;
    let shown = sqlx::query("SHOW GRANTS")
        .fetch_all(&mut *conn)
        .await
        .context("reading the inbox account's grants through roles (SHOW GRANTS)")?;
    let lines: Vec<String> = shown
        .iter()
        .filter_map(|r| r.try_get_unchecked::<String, _>(0).ok())
        .collect();
    // Older servers have no roles (and no ENABLED_ROLES view): none active.
    let active: Vec<String> = sqlx::query_scalar(ENABLED_ROLES)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_default();
    Ok(crate::probe_roles::role_grants(
        &lines, grantee, db, &active,
    ))
}

/// (privilege, table, column) the service uses in the inbox database.
fn inbox_needs(settings: &Settings) -> Vec<(&'static str, String, String)> {
    let (i, o) = (settings.inbox_names(), settings.outbox_names());
    let t = i.table.as_str().to_string();
    let ot = o.table.as_str().to_string();
    let mut needs = Vec::new();
    for c in [&i.id, &i.received, &i.message, &i.processed, &i.status] {
        needs.push(("SELECT", t.clone(), c.as_str().to_string()));
    }
    for c in [&i.status, &i.processed] {
        needs.push(("UPDATE", t.clone(), c.as_str().to_string()));
    }
    for c in [&o.id, &o.message] {
        needs.push(("SELECT", ot.clone(), c.as_str().to_string()));
    }
    for c in [&o.created, &o.message] {
        needs.push(("INSERT", ot.clone(), c.as_str().to_string()));
    }
    needs
}

fn judge_inbox(settings: &Settings, db: &str, grants: &[Grant]) -> Findings {
    let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let holds = |p: &str, t: &str, c: &str| {
        grants.iter().any(|g| {
            same(&g.privilege, p)
                && match g.level {
                    "global" | "schema" => true,
                    "table" => same(&g.table, t),
                    _ => same(&g.table, t) && same(&g.column, c),
                }
        })
    };
    let needs = inbox_needs(settings);
    let evidence = settings.late.hole_evidence;
    let mut f = Findings::default();
    for (p, t, c) in &needs {
        if !holds(p, t, c) {
            f.missing.push(format!("{p} (`{c}`) ON `{db}`.`{t}`"));
        }
    }
    if evidence && !holds("PROCESS", "", "") {
        f.missing
            .push("PROCESS ON *.* (late.hole_evidence = true reads INNODB_TRX)".to_string());
    }
    let (inbox_t, out_t) = (
        settings.inbox_names().table.as_str(),
        settings.outbox_names().table.as_str(),
    );
    let allowed = |g: &Grant| match g.level {
        _ if same(&g.privilege, "USAGE") => true,
        "global" => {
            evidence
                && [
                    "PROCESS",
                    "REPLICATION CLIENT",
                    "SLAVE MONITOR",
                    "REPLICA MONITOR",
                ]
                .iter()
                .any(|p| same(&g.privilege, p))
        }
        "table" => {
            (same(&g.table, inbox_t) && same(&g.privilege, "SELECT"))
                || (same(&g.table, out_t)
                    && (same(&g.privilege, "SELECT") || same(&g.privilege, "INSERT")))
        }
        "column" => {
            (same(&g.privilege, "SELECT") && (same(&g.table, inbox_t) || same(&g.table, out_t)))
                || needs.iter().any(|(p, t, c)| {
                    same(&g.privilege, p) && same(&g.table, t) && same(&g.column, c)
                })
        }
        _ => false,
    };
    // One line per scope: a root-like account would otherwise print thirty.
    let mut scopes: Vec<(String, Vec<String>)> = Vec::new();
    for g in grants.iter().filter(|g| !allowed(g)) {
        let scope = match g.level {
            "global" => "*.* (global)".to_string(),
            "schema" => format!("`{db}`.* (the whole database)"),
            "table" => format!("`{db}`.`{}`", g.table),
            _ => format!("`{db}`.`{}` column `{}`", g.table, g.column),
        };
        match scopes.iter_mut().find(|(s, _)| *s == scope) {
            Some((_, ps)) => ps.push(g.privilege.clone()),
            None => scopes.push((scope, vec![g.privilege.clone()])),
        }
    }
    f.excess = scopes
        .into_iter()
        .map(|(scope, ps)| format!("{} ON {scope}", ps.join(", ")))
        .collect();
    f
}

/// The store account's attributes and its rights in its database and schema.
type StoreRow = (bool, bool, bool, bool, bool, String, bool, bool, i64);

/// The audit trail's table: the one table the store account must NOT own (issue 55).
const AUDIT_TABLE: &str = "audit_log";

const STORE_PROBE: &str = "\
    SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls, \
           COALESCE(current_schema(), '(none)')::text, \
           has_database_privilege(current_database(), 'CONNECT'), \
           current_schema() IS NOT NULL \
             AND has_schema_privilege(current_schema(), 'USAGE, CREATE'), \
           (SELECT count(*) FROM pg_tables t \
             WHERE t.schemaname = current_schema() AND t.tableowner <> current_user \
               AND t.tablename <> 'audit_log') \
      FROM pg_roles r WHERE r.rolname = current_user";

/// The predefined roles that reach beyond the service's own tables, each a finding when the
/// account is a member (directly or through other roles, usable or by `SET ROLE`).
const PREDEFINED_ROLES: &[&str] = &[
    "pg_write_all_data",
    "pg_read_all_data",
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_execute_server_program",
    "pg_signal_backend",
];

/// The audit table's rights: (exists, owned by the account, INSERT, SELECT, UPDATE, DELETE,
/// TRUNCATE), through every role the account inherits.
type AuditRow = (bool, bool, bool, bool, bool, bool, bool);

const AUDIT_PROBE: &str = "\
    SELECT c.oid IS NOT NULL, \
           COALESCE(pg_get_userbyid(c.relowner) = current_user, false), \
           COALESCE(has_table_privilege(c.oid, 'INSERT'), false), \
           COALESCE(has_table_privilege(c.oid, 'SELECT'), false), \
           COALESCE(has_table_privilege(c.oid, 'UPDATE'), false), \
           COALESCE(has_table_privilege(c.oid, 'DELETE'), false), \
           COALESCE(has_table_privilege(c.oid, 'TRUNCATE'), false) \
      FROM (SELECT to_regclass('audit_log') AS oid) r \
      LEFT JOIN pg_class c ON c.oid = r.oid";

async fn probe_store(settings: &Settings) -> anyhow::Result<Findings> {
    let options = msgx_core::store::schema::connect_options(&settings.store)?;
    let mut conn = PgConnection::connect_with(&options)
        .await
        .context("connecting to the store")?;
    let row: StoreRow = sqlx::query_as(STORE_PROBE)
        .fetch_one(&mut conn)
        .await
        .context("reading the store account")?;
    let audit: AuditRow = sqlx::query_as(AUDIT_PROBE)
        .fetch_one(&mut conn)
        .await
        .context("reading the store account's rights on audit_log")?;
    let mut members = Vec::new();
    for role in PREDEFINED_ROLES {
        // A role missing on an older server is simply not held.
        let member: Option<bool> = sqlx::query_scalar(
            "SELECT pg_has_role(current_user, r.oid, 'MEMBER') FROM pg_roles r \
              WHERE r.rolname = $1",
        )
        .bind(*role)
        .fetch_optional(&mut conn)
        .await
        .context("reading the store account's role memberships")?;
        if member == Some(true) {
            members.push(*role);
        }
    }
    let _ = conn.close().await;
    let mut f = judge_store(row);
    judge_audit(audit, &mut f);
    for role in members {
        f.excess.push(format!(
            "membership of {role} (a predefined role reaching beyond the service's tables)"
        ));
    }
    Ok(f)
}

fn judge_store(row: StoreRow) -> Findings {
    let (superuser, createrole, createdb, replication, bypassrls, schema, connect, create, foreign) =
        row;
    let mut f = Findings::default();
    if !connect {
        f.missing.push("CONNECT on the database".to_string());
    }
    if !create {
        f.missing.push(format!(
            "USAGE, CREATE ON SCHEMA {schema} (the migrations create the tables at start)"
        ));
    }
    // A superuser may alter anyone's tables (and is reported below).
    if foreign > 0 && !superuser {
        f.missing.push(format!(
            "ownership of {foreign} table(s) in schema {schema} owned by another role \
             (migrations alter them, housekeeping vacuums them)"
        ));
    }
    // The probe connected to the database, so it exists: store.create_database never creates
    // it, and CREATEDB would only let a leaked password create others.
    for (held, what) in [
        (superuser, "SUPERUSER"),
        (createrole, "CREATEROLE"),
        (createdb, "CREATEDB"),
        (replication, "REPLICATION"),
        (bypassrls, "BYPASSRLS"),
    ] {
        if held {
            f.excess.push(format!("{what} (role attribute)"));
        }
    }
    f
}

/// The audit trail is append-only for the service (issue 55): it inserts and reads its rows;
/// owning the table, or updating, deleting or truncating it, would let a leaked password
/// rewrite the trail. Before the first migration there is no table to judge.
fn judge_audit(row: AuditRow, f: &mut Findings) {
    let (exists, owned, insert, select, update, delete, truncate) = row;
    if !exists {
        return;
    }
    for (held, what) in [(insert, "INSERT"), (select, "SELECT")] {
        if !held {
            f.missing
                .push(format!("{what} ON {AUDIT_TABLE} (every audited action)"));
        }
    }
    if owned {
        f.excess.push(format!(
            "ownership of {AUDIT_TABLE}: the audit trail can be rewritten with this password; \
             give the table to another role (docs/operations.md, \"Database accounts\")"
        ));
        return;
    }
    let rewrite: Vec<&str> = [
        (update, "UPDATE"),
        (delete, "DELETE"),
        (truncate, "TRUNCATE"),
    ]
    .into_iter()
    .filter_map(|(held, p)| held.then_some(p))
    .collect();
    if !rewrite.is_empty() {
        f.excess.push(format!(
            "{} ON {AUDIT_TABLE}: the audit trail can be rewritten with this password",
            rewrite.join(", ")
        ));
    }
}
