//! What the inbox account holds through roles (issue 55): information_schema's
//! `*_PRIVILEGES` views list only the account's own grants, so a site that grants through a
//! role (MariaDB's `SET DEFAULT ROLE`, MySQL 8's default roles) showed nothing there. The
//! server's `SHOW GRANTS` for the current account lists the active roles' grants as well (as
//! `GRANT … TO <role>`); this reads them. A granted role that is not active at login is named
//! on its own: its grants cannot be read without it, and a leaked password can `SET ROLE` to it.

/// One privilege a role grants, at the level it reaches the inbox database (the levels of
/// [`crate::probe`]'s grants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleGrant {
    /// `global`, `schema`, `table` or `column`.
    pub level: &'static str,
    /// The table (table and column levels).
    pub table: String,
    /// The column (column level).
    pub column: String,
    /// `SELECT`, `UPDATE`, …, or `GRANT OPTION`.
    pub privilege: String,
}

/// What one `SHOW GRANTS` line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// `GRANT <role>[, <role>] TO <grantee>`: roles granted to `grantee`.
    Roles { roles: Vec<String>, grantee: String },
    /// `GRANT <privileges> ON <scope> TO <grantee>`, as grants reaching database `db`.
    Privileges {
        grantee: String,
        grants: Vec<RoleGrant>,
    },
    /// Anything else (a proxy grant, `SET DEFAULT ROLE`, a grant on another database).
    Other,
}

/// `` `a``b` `` → ``a`b``; an unquoted word as is.
fn unquote(s: &str) -> String {
    let s = s.trim();
    match s.strip_prefix('`').and_then(|r| r.strip_suffix('`')) {
        Some(inner) => inner.replace("``", "`"),
        None => s.to_string(),
    }
}

/// `s` split at the commas outside parentheses and backquotes.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut quoted, mut start) = (Vec::new(), 0i32, false, 0);
    for (i, c) in s.char_indices() {
        match c {
            '`' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.retain(|p| !p.is_empty());
    out
}

/// SQL `LIKE` as a schema grant's name uses it (`%`, `_`, `\` escapes), case-insensitively.
fn like(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some(('%', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some(('_', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some(('\\', rest)) if !rest.is_empty() => {
                n.first().is_some_and(|c| c.eq_ignore_ascii_case(&rest[0]))
                    && go(&rest[1..], &n[1..])
            }
            Some((c, rest)) => {
                n.first().is_some_and(|x| x.eq_ignore_ascii_case(c)) && go(rest, &n[1..])
            }
        }
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    go(&p, &n)
}

/// The scope `ON …` names, if it reaches database `db`: (level, table).
fn scope(on: &str, db: &str) -> Option<(&'static str, String)> {
    let on = on.trim();
    // A routine's grant: `ON PROCEDURE db.p` — judged as a table of that name (never needed).
    let on = ["FUNCTION ", "PROCEDURE ", "PACKAGE BODY ", "PACKAGE "]
        .iter()
        .find_map(|k| on.strip_prefix(k))
        .unwrap_or(on);
    if on == "*.*" || on == "*" {
        return Some(("global", String::new()));
    }
    let (schema, table) = split_dot(on)?;
    let schema = unquote(schema);
    if table.trim() == "*" {
        return like(&schema, db).then(|| ("schema", String::new()));
    }
    schema
        .eq_ignore_ascii_case(db)
        .then(|| ("table", unquote(table)))
}

/// `` `a`.`b` `` at the dot outside backquotes.
fn split_dot(s: &str) -> Option<(&str, &str)> {
    let mut quoted = false;
    for (i, c) in s.char_indices() {
        match c {
            '`' => quoted = !quoted,
            '.' if !quoted => return Some((&s[..i], &s[i + 1..])),
            _ => {}
        }
    }
    None
}

/// The text between `GRANT ` and ` ON `, ` ON ` and ` TO `, and after ` TO ` (outside
/// backquotes, so a quoted name containing ` ON ` does not fool it).
fn parts(line: &str) -> Option<(&str, Option<&str>, &str)> {
    let rest = line.trim().strip_prefix("GRANT ")?;
    let find = |hay: &str, word: &str| -> Option<usize> {
        let mut quoted = false;
        for (i, c) in hay.char_indices() {
            if c == '`' {
                quoted = !quoted;
            } else if !quoted && hay[i..].starts_with(word) {
                return Some(i);
            }
        }
        None
    };
    let to = find(rest, " TO ")?;
    let (head, grantee) = (&rest[..to], &rest[to + 4..]);
    match find(head, " ON ") {
        Some(on) => Some((&head[..on], Some(&head[on + 4..]), grantee)),
        None => Some((head, None, grantee)),
    }
}

/// The grantee of a `TO …` tail, without `IDENTIFIED BY …` or `WITH … OPTION`.
fn grantee_of(tail: &str) -> (String, bool) {
    let grant_option = tail.contains("WITH GRANT OPTION");
    let end = [" IDENTIFIED ", " WITH ", " REQUIRE "]
        .iter()
        .filter_map(|w| tail.find(w))
        .min()
        .unwrap_or(tail.len());
    (tail[..end].trim().to_string(), grant_option)
}

/// Reads one `SHOW GRANTS` line as it reaches database `db`.
pub fn parse(line: &str, db: &str) -> Line {
    let Some((head, on, tail)) = parts(line) else {
        return Line::Other;
    };
    let (grantee, grant_option) = grantee_of(tail);
    let Some(on) = on else {
        if head.trim_start().starts_with('`') || head.trim_start().starts_with('\'') {
            let roles = split_top(head).into_iter().map(role_name).collect();
            return Line::Roles { roles, grantee };
        }
        return Line::Other;
    };
    if head.trim() == "PROXY" {
        return Line::Other;
    }
    let Some((level, table)) = scope(on, db) else {
        return Line::Other;
    };
    let mut grants = Vec::new();
    for p in split_top(head) {
        match p.split_once('(') {
            Some((name, cols)) if level == "table" => {
                for c in split_top(cols.trim_end_matches(')')) {
                    grants.push(RoleGrant {
                        level: "column",
                        table: table.clone(),
                        column: unquote(c),
                        privilege: name.trim().to_string(),
                    });
                }
            }
            _ => grants.push(RoleGrant {
                level,
                table: table.clone(),
                column: String::new(),
                privilege: p.trim().to_string(),
            }),
        }
    }
    if grant_option {
        grants.push(RoleGrant {
            level,
            table,
            column: String::new(),
            privilege: "GRANT OPTION".into(),
        });
    }
    Line::Privileges { grantee, grants }
}

/// `` `r` `` or `` `r`@`%` `` (MySQL 8) → `r`.
fn role_name(s: &str) -> String {
    match split_at_host(s) {
        Some((name, _)) => unquote(name),
        None => unquote(s),
    }
}

/// `` `u`@`h` `` at the `@` outside backquotes.
fn split_at_host(s: &str) -> Option<(&str, &str)> {
    let mut quoted = false;
    for (i, c) in s.char_indices() {
        match c {
            '`' | '\'' => quoted = !quoted,
            '@' if !quoted => return Some((&s[..i], &s[i + 1..])),
            _ => {}
        }
    }
    None
}

/// The grants that reach `db` through roles, from the whole `SHOW GRANTS` output of the
/// account `me` (its `` `user`@`host` ``): every privilege line whose grantee is not `me`
/// (an active role's), and each role granted to the account that is not in `active`, named.
pub fn role_grants(
    lines: &[String],
    me: &str,
    db: &str,
    active: &[String],
) -> (Vec<RoleGrant>, Vec<String>) {
    let same = |a: &str, b: &str| {
        a.replace('\'', "`")
            .eq_ignore_ascii_case(&b.replace('\'', "`"))
    };
    let (mut grants, mut inactive) = (Vec::new(), Vec::new());
    for line in lines {
        match parse(line, db) {
            Line::Privileges { grantee, grants: g } if !same(&grantee, me) => grants.extend(g),
            Line::Roles { roles, grantee } if same(&grantee, me) => {
                for r in roles {
                    if !active.iter().any(|a| a.eq_ignore_ascii_case(&r)) && !inactive.contains(&r)
                    {
                        inactive.push(r);
                    }
                }
            }
            _ => {}
        }
    }
    (grants, inactive)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MariaDB 10.11's `SHOW GRANTS` for a user with a default role that holds a nested role.
    const SHOWN: &[&str] = &[
        "GRANT `r55probe` TO `u55probe`@`%`",
        "GRANT USAGE ON *.* TO `u55probe`@`%` IDENTIFIED BY PASSWORD '*D821809F681A40A6E379B50D0463EFAE20BDD122'",
        "GRANT INSERT ON `p55db`.`t` TO `u55probe`@`%` WITH GRANT OPTION",
        "GRANT `r55inner` TO `r55probe`",
        "GRANT USAGE ON *.* TO `r55probe`",
        "GRANT SELECT ON `p55db`.* TO `r55probe`",
        "GRANT UPDATE (`a`, `b c`) ON `p55db`.`t` TO `r55probe`",
        "GRANT USAGE ON *.* TO `r55inner`",
        "GRANT DELETE ON `p55db`.`t` TO `r55inner`",
        "GRANT SELECT ON `other`.* TO `r55inner`",
        "GRANT `spare` TO `u55probe`@`%`",
    ];

    fn g(level: &'static str, table: &str, column: &str, privilege: &str) -> RoleGrant {
        RoleGrant {
            level,
            table: table.into(),
            column: column.into(),
            privilege: privilege.into(),
        }
    }

    #[test]
    fn the_active_roles_grants_are_read_and_an_inactive_role_is_named() {
        let lines: Vec<String> = SHOWN.iter().map(|s| s.to_string()).collect();
        let active = vec!["r55probe".to_string(), "r55inner".to_string()];
        let (grants, inactive) = role_grants(&lines, "`u55probe`@`%`", "p55db", &active);
        assert_eq!(
            grants,
            vec![
                g("global", "", "", "USAGE"),
                g("schema", "", "", "SELECT"),
                g("column", "t", "a", "UPDATE"),
                g("column", "t", "b c", "UPDATE"),
                g("global", "", "", "USAGE"),
                g("table", "t", "", "DELETE"),
            ]
        );
        assert_eq!(inactive, vec!["spare".to_string()]);
    }

    #[test]
    fn grant_option_and_mysql_8_spellings() {
        let Line::Privileges { grants, grantee } = parse(
            "GRANT INSERT ON `p55db`.`t` TO `u`@`%` WITH GRANT OPTION",
            "p55db",
        ) else {
            panic!("privileges");
        };
        assert_eq!(grantee, "`u`@`%`");
        assert_eq!(grants[1], g("table", "t", "", "GRANT OPTION"));
        assert_eq!(
            parse("GRANT `r1`@`%`,`r2`@`%` TO `u`@`%`", "db"),
            Line::Roles {
                roles: vec!["r1".into(), "r2".into()],
                grantee: "`u`@`%`".into()
            }
        );
        assert!(like("inbox\\_db", "INBOX_DB") && like("in%", "inbox") && !like("in\\_x", "inax"));
        assert_eq!(
            parse("GRANT PROXY ON ''@'' TO 'root'@'localhost'", "db"),
            Line::Other
        );
    }
}
