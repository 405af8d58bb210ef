//! Bearer tokens with scopes for the HTTP surface (`http.read_tokens`, `http.operate_tokens`,
//! `http.compat_tokens`; `http.admin_token` is a token with every scope, kept for existing
//! installations). Compared in constant time, never logged. `/metrics`, `/healthz` and
//! `/readyz` need no token.
//!
//! - `read`: every `GET /admin/*` (status, messages, dead events, verify, survey,
//!   purge-readiness, cutover-plan);
//! - `operate`: the audited mutations `POST /admin/*` (and everything `read` may);
//! - `compat`: `POST /cminmsgs/send` only (upstream's entry; it cannot read or operate).
//!
//! Every token has a name (`name:secret`; a bare secret of earlier versions is named
//! `<scope>-<n>`, or `admin`): the name a request's token matched is what the audit log
//! records beside the actor the body states, and what the logs say ([`Caller`]).
//!
//! No token → 401; a valid token without the scope → 403 ([`Denied`], which the admin
//! surface answers as its `AdminError`). Either answer changes nothing.

use actix_web::http::header;
use actix_web::HttpRequest;
use msgx_core::settings::HttpSettings;
use msgx_core::telemetry;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Read-only admin views.
    Read,
    /// Audited mutations (implies read).
    Operate,
    /// The compat entry only.
    Compat,
}

impl Scope {
    /// As in the settings and the 403's message.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Operate => "operate",
            Self::Compat => "compat",
        }
    }
}

/// One configured token.
#[derive(Clone)]
struct Entry {
    name: std::sync::Arc<str>,
    secret: Vec<u8>,
    scopes: &'static [Scope],
}

/// The configured tokens, their names and scopes.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<Entry>,
}

/// The name of the token a request was allowed with (what the audit log records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub std::sync::Arc<str>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tokens({} configured, values redacted)",
            self.entries.len()
        )
    }
}

const ALL: &[Scope] = &[Scope::Read, Scope::Operate, Scope::Compat];
const OPERATE: &[Scope] = &[Scope::Read, Scope::Operate];
const READ: &[Scope] = &[Scope::Read];
const COMPAT: &[Scope] = &[Scope::Compat];

impl Tokens {
    /// From `[http]` ([`HttpSettings::tokens`]): `admin_token` (all scopes), `read_tokens`,
    /// `operate_tokens`, `compat_tokens` (validated by `Settings::validate`). A token without
    /// a name is logged once here, with the name its audit rows will carry.
    pub fn from_settings(http: &HttpSettings) -> Self {
        let entries = http
            .tokens()
            .into_iter()
            .map(|t| {
                if !t.named {
                    tracing::warn!(
                        key = t.key,
                        name = %t.name,
                        "a token without a name: its audit rows name it `{}`; write `name:secret`",
                        t.name
                    );
                }
                let scopes = match t.key {
                    "http.read_tokens" => READ,
                    "http.operate_tokens" => OPERATE,
                    "http.compat_tokens" => COMPAT,
                    _ => ALL,
                };
                Entry {
                    name: t.name.into(),
                    secret: t.secret.as_bytes().to_vec(),
                    scopes,
                }
            })
            .collect();
        Self { entries }
    }

    /// Tokens from explicit `(token, scope)` pairs (tests), each named `<scope>-<n>`.
    pub fn with(pairs: &[(&str, Scope)]) -> Self {
        let named: Vec<(String, &str, Scope)> = pairs
            .iter()
            .enumerate()
            .map(|(i, (t, s))| (format!("{}-{}", s.name(), i + 1), *t, *s))
            .collect();
        let refs: Vec<(&str, &str, Scope)> =
            named.iter().map(|(n, t, s)| (n.as_str(), *t, *s)).collect();
        Self::named(&refs)
    }

    /// Tokens from explicit `(name, token, scope)` triples (tests).
    pub fn named(triples: &[(&str, &str, Scope)]) -> Self {
        let entries = triples
            .iter()
            .map(|(name, t, s)| Entry {
                name: (*name).into(),
                secret: t.as_bytes().to_vec(),
                scopes: match s {
                    Scope::Read => READ,
                    Scope::Operate => OPERATE,
                    Scope::Compat => COMPAT,
                },
            })
            .collect();
        Self { entries }
    }

    /// No token at all: the admin surface and the compat entry are not served (404).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the request's bearer token is configured at all, and the name of the entry
    /// that matched it with `scope`. Every configured token is compared (in constant time
    /// each), so the answer's timing says nothing about which one matched; a token listed
    /// twice has both lists' scopes.
    fn grant(&self, req: &HttpRequest, scope: Scope) -> (bool, Option<Caller>) {
        let Some(given) = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
        else {
            return (false, None);
        };
        let (mut known, mut allowed) = (false, None);
        for e in &self.entries {
            let matched = same(given.as_bytes(), &e.secret);
            known |= matched;
            if matched && e.scopes.contains(&scope) && allowed.is_none() {
                allowed = Some(Caller(e.name.clone()));
            }
        }
        (known, allowed)
    }

    /// The token's name when the request carries a token with `scope`; else why not (counted
    /// and logged here, with the path, never the token: WARN at most once a minute).
    pub fn check(&self, req: &HttpRequest, scope: Scope) -> Result<Caller, Denied> {
        match self.grant(req, scope) {
            (_, Some(caller)) => Ok(caller),
            (true, None) => {
                telemetry::http_refused("forbidden", req.path(), req.peer_addr());
                Err(Denied::Forbidden(scope))
            }
            (false, None) => {
                telemetry::http_refused("unauthenticated", req.path(), req.peer_addr());
                Err(Denied::Unauthenticated)
            }
        }
    }
}

/// Why a request may not use a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No bearer token, or one that is not configured (401).
    Unauthenticated,
    /// A configured token without the scope (403).
    Forbidden(Scope),
}

/// The token of an `Authorization: Bearer <token>` value: the scheme is matched without
/// regard to case and may be followed by more than one space (RFC 7235 §2.1, RFC 6750 §2.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    let token = rest.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Constant-time comparison: the time depends only on the configured token's length, never on
/// how much of it the given one matches.
pub fn same(given: &[u8], token: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != token.len());
    for (i, t) in token.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(0) ^ t;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 55: the scheme's case does not matter (RFC 7235); the token's does.
    #[test]
    fn the_bearer_scheme_is_matched_without_case() {
        for v in ["Bearer t0k", "bearer t0k", "BEARER t0k", "bEaReR  t0k"] {
            assert_eq!(bearer(v), Some("t0k"), "{v}");
        }
        for v in ["Basic t0k", "Bearer", "Bearer ", "Bearert0k", "t0k"] {
            assert_eq!(bearer(v), None, "{v}");
        }
    }

    #[test]
    fn token_comparison_is_exact() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeF"));
        assert!(!same(b"0123456789abcde", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef0", b"0123456789abcdef"));
        assert!(!same(b"", b"x"));
    }
}
