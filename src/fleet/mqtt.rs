//! The MQTT transport of the fleet layers: subscribes (on every connect) to the retained
//! `edgewatch/config/all`, `edgewatch/config/group/{group}` and
//! `edgewatch/config/device/{device_id}`, hands each document to [`super::receive`] in
//! order, and publishes the device's retained JSON status to
//! `edgewatch/{device_id}/config/status` after each one and on each connect. A broker that
//! is down is retried with backoff, logged rate-limited; nothing here blocks start-up.
//! Also [`publish`], the one-shot retained publish of `edgewatch fleet publish`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio_util::sync::CancellationToken;

use super::config::FleetConfig;
use super::FleetLayers;
use crate::config::layers::ReloadSender;
use crate::deliver::mqtt;

/// The topic of layer `source` (`all`, `group:NAME`, `device`) for `device_id`.
pub fn topic_of(source: &str, device_id: &str) -> String {
    match source.strip_prefix("group:") {
        Some(g) => format!("edgewatch/config/group/{g}"),
        None if source == "device" => format!("edgewatch/config/device/{device_id}"),
        None => format!("edgewatch/config/{source}"),
    }
}

/// The topic a publish `--target` (`all`, `group:NAME`, `device:ID`) goes to.
pub fn target_topic(target: &str) -> Result<String, String> {
    let ok = |s: &str| !s.is_empty() && !s.contains(['/', '+', '#']);
    match target.split_once(':') {
        None if target == "all" => Ok("edgewatch/config/all".into()),
        Some(("group", g)) if ok(g) => Ok(format!("edgewatch/config/group/{g}")),
        Some(("device", d)) if ok(d) => Ok(format!("edgewatch/config/device/{d}")),
        _ => Err(format!(
            "target {target:?}: expected all, group:NAME or device:ID"
        )),
    }
}

/// The device's status topic.
pub fn status_topic(device_id: &str) -> String {
    format!("edgewatch/{device_id}/config/status")
}

fn options(cfg: &FleetConfig, url: &str, client_id: String) -> Result<MqttOptions, String> {
    let credentials = cfg.credentials();
    let e = mqtt::Endpoint {
        url,
        client_id,
        credentials: &credentials,
        keepalive: Duration::from_secs(30),
        clean_session: true,
        tls: cfg.tls_files(),
    };
    let mut o = mqtt::options(&e).map_err(|e| e.to_string())?;
    // Incoming: room for a document well over the cap, so an oversized one is read and
    // refused with its reason (a packet over this limit drops the connection instead).
    let incoming = cfg.max_document_bytes.saturating_mul(16).max(1 << 20);
    let outgoing = cfg.max_document_bytes.saturating_add(4096).max(64 * 1024);
    o.set_max_packet_size(incoming, outgoing);
    Ok(o)
}

/// Runs until `stop`: receives the layers' documents and publishes the status.
pub async fn run(
    layers: Arc<FleetLayers>,
    cfg: FleetConfig,
    reload: ReloadSender,
    stop: CancellationToken,
) {
    let Some(url) = cfg.mqtt.clone() else {
        return;
    };
    let device_id = layers.device_id().to_string();
    let opts = match options(&cfg, &url, format!("edgewatch-fleet-{device_id}")) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(%url, error = %e, "fleet broker cannot be used until this is fixed");
            layers.count(|c| c.link = Some(e));
            layers.write_report();
            return;
        }
    };
    let topics: HashMap<String, String> = layers
        .sources()
        .iter()
        .map(|s| (topic_of(s, &device_id), s.clone()))
        .collect();
    let (client, mut events) = AsyncClient::new(opts, 64);
    // Documents are handled in order, away from the event loop (a reload can take a while).
    let (docs, mut inbox) = tokio::sync::mpsc::channel::<(String, Vec<u8>)>(16);
    let status = status_topic(&device_id);
    let handler = {
        let (layers, client, status) = (layers.clone(), client.clone(), status.clone());
        tokio::spawn(async move {
            while let Some((source, payload)) = inbox.recv().await {
                super::receive(&layers, &source, &payload, &reload).await;
                let report = layers.report().to_string();
                if let Err(e) = client
                    .publish(&status, QoS::AtLeastOnce, true, report)
                    .await
                {
                    tracing::debug!(error = %e, "fleet status not queued");
                }
            }
        })
    };
    let mut failures = 0u32;
    let mut shown: Option<String> = None;
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => break,
            ev = events.poll() => ev,
        };
        match ev {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                if failures > 0 {
                    tracing::info!(%url, "fleet broker connected again");
                }
                failures = 0;
                layers.count(|c| c.link = Some("connected".into()));
                shown = None;
                for t in topics.keys() {
                    if let Err(e) = client.try_subscribe(t.clone(), QoS::AtLeastOnce) {
                        tracing::warn!(topic = %t, error = %e, "fleet subscribe not queued");
                    }
                }
                let report = layers.write_report().to_string();
                let _ = client.try_publish(&status, QoS::AtLeastOnce, true, report);
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let Some(source) = topics.get(&p.topic) else {
                    continue;
                };
                if p.payload.is_empty() {
                    tracing::info!(layer = %source, "fleet layer cleared on the broker; the applied one stays");
                    continue;
                }
                if docs
                    .send((source.clone(), p.payload.to_vec()))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                failures = failures.saturating_add(1);
                let msg = e.to_string();
                if failures.is_power_of_two() {
                    tracing::warn!(%url, error = %msg, failures, "fleet broker unreachable; retrying");
                }
                // The status file follows the link's state, written when it changes.
                let changed = shown.as_deref() != Some(msg.as_str());
                layers.count(|c| c.link = Some(msg.clone()));
                if changed {
                    layers.write_report();
                    shown = Some(msg);
                }
                let wait =
                    Duration::from_millis(500u64 << failures.min(6)).min(Duration::from_secs(30));
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
    drop(docs);
    handler.abort();
}

/// Publishes `payload` retained at QoS 1 to `topic` and waits for the broker's PUBACK.
pub async fn publish(
    cfg: &FleetConfig,
    url: &str,
    client_id: String,
    topic: &str,
    payload: Vec<u8>,
    timeout: Duration,
) -> Result<(), String> {
    let mut opts = options(cfg, url, client_id)?;
    // The devices enforce their own cap; the publisher sends what it is given.
    opts.set_max_packet_size(1 << 20, payload.len().saturating_add(4096));
    let (client, mut events) = AsyncClient::new(opts, 8);
    client
        .publish(topic, QoS::AtLeastOnce, true, payload)
        .await
        .map_err(|e| e.to_string())?;
    let wait = async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(format!("{url}: {e}")),
            }
        }
    };
    let r = tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| format!("{url}: no PUBACK in {}s", timeout.as_secs()))?;
    let _ = client.try_disconnect();
    let _ = tokio::time::timeout(Duration::from_secs(1), events.poll()).await;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_of_layers_and_targets_agree() {
        assert_eq!(topic_of("all", "d1"), "edgewatch/config/all");
        assert_eq!(topic_of("group:lab", "d1"), "edgewatch/config/group/lab");
        assert_eq!(topic_of("device", "d1"), "edgewatch/config/device/d1");
        assert_eq!(target_topic("all").unwrap(), topic_of("all", "x"));
        assert_eq!(
            target_topic("group:lab").unwrap(),
            topic_of("group:lab", "x")
        );
        assert_eq!(target_topic("device:d1").unwrap(), topic_of("device", "d1"));
        for bad in ["", "group:", "device:a/b", "groups:x", "al"] {
            assert!(target_topic(bad).is_err(), "{bad}");
        }
    }
}
