//! The HTTP pull transport of the fleet layers: every `poll`, GET `<url>/all`,
//! `<url>/group/<group>` for each group and `<url>/device/<device_id>` (the MQTT topics'
//! layout) with `If-None-Match` and the ETag last seen; 304 costs nothing and is counted,
//! 404 means the layer is not published, 200 is a document for [`super::receive`]. Requests
//! run on the blocking pool (`ureq`); failures are logged rate-limited and shown in the
//! status. Never blocks start-up: the first poll happens after the agent is up.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::config::FleetConfig;
use super::FleetLayers;
use crate::config::layers::ReloadSender;

/// The URL of layer `source` under `base`.
pub fn url_of(base: &str, source: &str, device_id: &str) -> String {
    let base = base.trim_end_matches('/');
    match source.strip_prefix("group:") {
        Some(g) => format!("{base}/group/{g}"),
        None if source == "device" => format!("{base}/device/{device_id}"),
        None => format!("{base}/{source}"),
    }
}

/// One answer.
enum Fetched {
    NotModified,
    Missing,
    Body { etag: Option<String>, body: Vec<u8> },
}

fn fetch(
    agent: &ureq::Agent,
    url: &str,
    etag: Option<&str>,
    max: usize,
) -> Result<Fetched, String> {
    let mut req = agent.get(url);
    if let Some(t) = etag {
        req = req.set("If-None-Match", t);
    }
    match req.call() {
        Ok(r) if r.status() == 304 => Ok(Fetched::NotModified),
        Ok(r) if r.status() == 200 => {
            let etag = r.header("ETag").map(str::to_string);
            let mut body = Vec::new();
            r.into_reader()
                .take(max as u64 + 1)
                .read_to_end(&mut body)
                .map_err(|e| format!("{url}: reading the body: {e}"))?;
            Ok(Fetched::Body { etag, body })
        }
        Ok(r) => Err(format!("{url}: unexpected status {}", r.status())),
        Err(ureq::Error::Status(404, _)) => Ok(Fetched::Missing),
        Err(ureq::Error::Status(code, _)) => Err(format!("{url}: status {code}")),
        Err(e) => Err(format!("{url}: {e}")),
    }
}

/// Runs until `stop`: polls every layer's URL every `poll`.
pub async fn run(
    layers: Arc<FleetLayers>,
    cfg: FleetConfig,
    reload: ReloadSender,
    stop: CancellationToken,
) {
    let Some(base) = cfg.url.clone() else {
        return;
    };
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .redirects(0)
        .build();
    let device_id = layers.device_id().to_string();
    let mut etags: HashMap<String, String> = HashMap::new();
    let mut failures = 0u32;
    loop {
        let mut failed = None;
        for source in layers.sources().to_vec() {
            let url = url_of(&base, &source, &device_id);
            let (a, u, t) = (agent.clone(), url.clone(), etags.get(&source).cloned());
            let max = cfg.max_document_bytes;
            let got = tokio::task::spawn_blocking(move || fetch(&a, &u, t.as_deref(), max))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            match got {
                Ok(Fetched::NotModified) => layers.count(|c| c.not_modified += 1),
                Ok(Fetched::Missing) => {}
                Ok(Fetched::Body { etag, body }) => {
                    match etag {
                        Some(t) => etags.insert(source.clone(), t),
                        None => etags.remove(&source),
                    };
                    super::receive(&layers, &source, &body, &reload).await;
                }
                Err(e) => failed = Some(e),
            }
        }
        layers.count(|c| {
            c.polls += 1;
            c.link = Some(failed.clone().unwrap_or_else(|| "ok".into()));
        });
        layers.write_report();
        match failed {
            Some(e) => {
                failures = failures.saturating_add(1);
                if failures.is_power_of_two() {
                    tracing::warn!(error = %e, failures, "fleet config server unreachable; polling on");
                }
            }
            None => {
                if failures > 0 {
                    tracing::info!(url = %base, "fleet config server answers again");
                }
                failures = 0;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(cfg.poll.0) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_urls_follow_the_topic_layout() {
        assert_eq!(url_of("http://h/c/", "all", "d"), "http://h/c/all");
        assert_eq!(
            url_of("http://h/c", "group:lab", "d"),
            "http://h/c/group/lab"
        );
        assert_eq!(url_of("http://h/c", "device", "d7"), "http://h/c/device/d7");
    }
}
