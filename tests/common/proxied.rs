//! The inbox reached through a cuttable [`Proxy`], for tests of a lost inbox connection.

use msgx_core::inbox::Inbox;
use msgx_core::settings::Settings;

use super::proxy::Proxy;
use super::TestEnv;

/// Inbox timeouts short enough for a cut to show quickly.
pub const QUICK_INBOX: &[(&str, &str)] = &[
    ("MSGX_INBOX__CONNECT_TIMEOUT", "500ms"),
    ("MSGX_INBOX__QUERY_TIMEOUT", "2s"),
];

/// The proxy, the settings (with their overrides) whose inbox URL goes through it, and an
/// inbox adapter on that URL.
pub struct ProxiedInbox {
    /// Cut and restore the inbox connection with it.
    pub proxy: Proxy,
    /// This env's settings, the inbox URL through the proxy.
    pub settings: Settings,
    /// The inbox adapter through the proxy.
    pub inbox: Inbox,
}

impl TestEnv {
    /// An inbox adapter on this env's names and zone, its settings with these overrides
    /// (another URL, other timeouts).
    pub fn inbox_with(&self, extra: &[(&str, &str)]) -> Inbox {
        let settings = self.settings(extra);
        Inbox::new(&settings.inbox, &self.names, self.tz).expect("inbox")
    }

    /// Starts a proxy to the test MariaDB; settings with `extra` and an inbox adapter that
    /// reach this env's inbox through it.
    pub async fn inbox_via_proxy(&self, extra: &[(&str, &str)]) -> ProxiedInbox {
        let proxy = Proxy::start("127.0.0.1:3306").await;
        let mut settings = self.settings(extra);
        settings.inbox.connect.url =
            format!("mysql://root@127.0.0.1:{}/{}", proxy.port, self.db).into();
        let inbox = Inbox::new(&settings.inbox, &self.names, self.tz).expect("adapter");
        ProxiedInbox {
            proxy,
            settings,
            inbox,
        }
    }
}
