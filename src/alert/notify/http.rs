//! Alertmanager and webhook notifiers over HTTP: a blocking `ureq` agent on the notifier's
//! thread, one event per request (`POST {url}/api/v2/alerts` with a one-alert array, or
//! `POST {url}` with the webhook message), JSON, basic auth or a bearer token and the
//! configured headers. Answers are classified by [`super::classify`]; nothing here retries
//! or touches the store.

use base64::Engine as _;

use super::config::{NotifyConfig, NotifyKind};
use super::{classify, payload, Outcome, Transport};
use crate::alert::event::AlertEvent;

/// One HTTP receiver.
pub(super) struct Http {
    agent: ureq::Agent,
    cfg: NotifyConfig,
    url: String,
}

impl Http {
    pub(super) fn new(cfg: &NotifyConfig) -> Http {
        let url = match cfg.kind {
            NotifyKind::Alertmanager => {
                format!("{}/api/v2/alerts", cfg.url.trim_end_matches('/'))
            }
            _ => cfg.url.clone(),
        };
        Http {
            agent: ureq::AgentBuilder::new().timeout(cfg.timeout.0).build(),
            cfg: cfg.clone(),
            url,
        }
    }

    fn post(&self, body: &[u8]) -> Outcome {
        let mut req = self
            .agent
            .post(&self.url)
            .set("Content-Type", "application/json")
            .set(
                "User-Agent",
                concat!("edgewatch/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(t) = &self.cfg.bearer_token {
            req = req.set("Authorization", &format!("Bearer {}", t.expose()));
        } else if let Some(u) = &self.cfg.username {
            let pw = self.cfg.password.as_ref().map_or("", |p| p.expose());
            let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{pw}"));
            req = req.set("Authorization", &format!("Basic {b}"));
        }
        for (k, v) in &self.cfg.headers {
            req = req.set(k, v);
        }
        match req.send_bytes(body) {
            Ok(r) => classify(r.status(), None, ""),
            Err(ureq::Error::Status(code, r)) => {
                let ra = r.header("Retry-After").map(str::to_string);
                let body = r.into_string().unwrap_or_default();
                classify(code, ra.as_deref(), &body)
            }
            Err(e) => Outcome::Retry {
                reason: format!("cannot reach {}: {e}", self.url),
            },
        }
    }
}

impl Transport for Http {
    fn send(&mut self, seq: i64, ev: &AlertEvent) -> Outcome {
        let body = match self.cfg.kind {
            NotifyKind::Alertmanager => payload::alertmanager(&[ev]),
            _ => payload::webhook(&self.cfg.name, seq, ev),
        };
        self.post(&body)
    }

    fn resend(&mut self, firing: &[AlertEvent]) -> Option<Outcome> {
        (self.cfg.kind == NotifyKind::Alertmanager).then(|| {
            let refs: Vec<&AlertEvent> = firing.iter().collect();
            self.post(&payload::alertmanager(&refs))
        })
    }
}
