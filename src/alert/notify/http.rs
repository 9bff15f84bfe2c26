//! Alertmanager and webhook notifiers over HTTP: one event per request (`POST
//! {url}/api/v2/alerts` with a one-alert array, or `POST {url}` with the webhook message),
//! JSON, through the delivery core's [`HttpPeer`] (basic auth or a bearer token, the
//! configured headers, the shared answer classification). Nothing here retries or touches
//! the store.

use super::config::{NotifyConfig, NotifyKind};
use super::{payload, Transport};
use crate::alert::event::AlertEvent;
use crate::deliver::{Auth, HttpPeer, Outcome, Peer};

/// One HTTP receiver.
pub(super) struct Http {
    peer: HttpPeer,
    kind: NotifyKind,
    name: String,
}

impl Http {
    pub(super) fn new(cfg: &NotifyConfig) -> Http {
        let url = match cfg.kind {
            NotifyKind::Alertmanager => {
                format!("{}/api/v2/alerts", cfg.url.trim_end_matches('/'))
            }
            _ => cfg.url.clone(),
        };
        let auth = Auth::basic_or_bearer(&cfg.credentials, cfg.bearer_token.as_ref());
        let headers = cfg.headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        Http {
            peer: HttpPeer::new(Peer::Notifier, url, cfg.retry.timeout.0, &auth, headers),
            kind: cfg.kind,
            name: cfg.name.clone(),
        }
    }

    fn post(&self, body: &[u8]) -> Outcome {
        self.peer
            .post(&[("Content-Type", "application/json")], body)
    }
}

impl Transport for Http {
    fn send(&mut self, seq: i64, ev: &AlertEvent) -> Outcome {
        let body = match self.kind {
            NotifyKind::Alertmanager => payload::alertmanager(&[ev]),
            _ => payload::webhook(&self.name, seq, ev),
        };
        self.post(&body)
    }

    fn resend(&mut self, firing: &[AlertEvent]) -> Option<Outcome> {
        (self.kind == NotifyKind::Alertmanager).then(|| {
            let refs: Vec<&AlertEvent> = firing.iter().collect();
            self.post(&payload::alertmanager(&refs))
        })
    }
}
