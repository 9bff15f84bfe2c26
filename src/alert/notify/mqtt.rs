//! The MQTT notifier (`rumqttc`, blocking client): one JSON message per event, QoS 1 (or 2)
//! to the topic template, one message in flight; `send` returns only when the broker
//! acknowledged it (PUBACK, or PUBCOMP at QoS 2), failed, or `timeout` passed.
//!
//! Each connection gets a fresh client whose event loop is polled on a thread of its own,
//! never cancelled mid-write; the thread reports what happens over a channel and ends with
//! the connection. There is never more than one such thread: rumqttc's connect gives up
//! after `timeout` too, and a new connection first joins the previous thread. The
//! connection options (TLS, client certificates, keepalive) are the delivery core's
//! ([`crate::deliver::mqtt`]). A connection that dies takes the unacknowledged message with it; the
//! notifier sends it again on the next one (at most one duplicate per fault). Nothing here
//! retries on its own or touches the store.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, MqttOptions, Outgoing, Packet, QoS};

use super::config::NotifyConfig;
use super::{payload, Transport};
use crate::alert::event::AlertEvent;
use crate::deliver::{mqtt, Outcome};

/// What the connection thread reports.
enum Ev {
    Connected,
    /// A publish left with this packet id.
    Sent(u16),
    /// The broker acknowledged this packet id.
    Acked(u16),
    Down(String),
}

struct Conn {
    client: Client,
    rx: mpsc::Receiver<Ev>,
}

/// One MQTT receiver.
pub(super) struct Mqtt {
    opts: Result<MqttOptions, String>,
    topic: String,
    qos: QoS,
    timeout: Duration,
    device_id: String,
    conn: Option<Conn>,
    /// The connection thread of the current (or last) connection.
    thread: Option<std::thread::JoinHandle<()>>,
}

fn options(cfg: &NotifyConfig, device_id: &str) -> Result<MqttOptions, String> {
    let e = mqtt::Endpoint {
        url: &cfg.url,
        client_id: cfg
            .client_id
            .clone()
            .unwrap_or_else(|| format!("edgewatch-{device_id}-notify-{}", cfg.name)),
        credentials: &cfg.credentials,
        keepalive: cfg.keepalive.map_or(Duration::from_secs(30), |k| k.0),
        // The notifier republishes what a dead connection had in flight itself.
        clean_session: true,
        tls: cfg.tls_files(),
    };
    mqtt::options(&e).map_err(|e| e.to_string())
}

impl Mqtt {
    pub(super) fn new(cfg: &NotifyConfig, device_id: &str) -> Mqtt {
        Mqtt {
            opts: options(cfg, device_id),
            topic: payload::topic(cfg.topic.as_deref().unwrap_or(""), device_id),
            qos: if cfg.qos == Some(2) {
                QoS::ExactlyOnce
            } else {
                QoS::AtLeastOnce
            },
            timeout: cfg.retry.timeout.0.max(Duration::from_millis(100)),
            device_id: device_id.to_string(),
            conn: None,
            thread: None,
        }
    }

    /// A connected client, connecting first if needed.
    fn connect(&mut self) -> Result<&Conn, String> {
        if self.conn.is_none() {
            let opts = self.opts.clone()?;
            // The previous connection's thread ends within rumqttc's connect timeout once
            // its client is gone: wait for it, so threads never pile up.
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
            let (client, mut connection) = Client::new(opts, 16);
            connection
                .eventloop
                .network_options
                .set_connection_timeout(mqtt::connect_timeout_s(self.timeout));
            let (tx, rx) = mpsc::channel();
            let thread = std::thread::Builder::new()
                .name("notify-mqtt-conn".into())
                .spawn(move || loop {
                    let msg = match connection.recv() {
                        Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => Ev::Connected,
                        Ok(Ok(Event::Incoming(Packet::PubAck(a)))) => Ev::Acked(a.pkid),
                        Ok(Ok(Event::Incoming(Packet::PubComp(a)))) => Ev::Acked(a.pkid),
                        Ok(Ok(Event::Outgoing(Outgoing::Publish(pkid)))) => Ev::Sent(pkid),
                        Ok(Ok(Event::Outgoing(Outgoing::Disconnect))) => {
                            let _ = tx.send(Ev::Down("disconnected".into()));
                            return;
                        }
                        Ok(Ok(_)) => continue,
                        Ok(Err(e)) => {
                            let _ = tx.send(Ev::Down(e.to_string()));
                            return;
                        }
                        // Every client handle is gone.
                        Err(_) => return,
                    };
                    if tx.send(msg).is_err() {
                        return;
                    }
                })
                .map_err(|e| format!("cannot start the MQTT connection thread: {e}"))?;
            self.thread = Some(thread);
            let conn = Conn { client, rx };
            match conn.rx.recv_timeout(self.timeout) {
                Ok(Ev::Connected) => self.conn = Some(conn),
                Ok(Ev::Down(e)) => return Err(format!("cannot connect: {e}")),
                Ok(_) => return Err("unexpected packet before CONNACK".into()),
                Err(_) => {
                    let _ = conn.client.disconnect();
                    return Err(format!("no CONNACK within {:?}", self.timeout));
                }
            }
        }
        self.conn.as_ref().ok_or_else(|| "not connected".into())
    }

    fn publish(&mut self, body: Vec<u8>) -> Result<(), String> {
        let (topic, qos, timeout) = (self.topic.clone(), self.qos, self.timeout);
        let conn = self.connect()?;
        conn.client
            .publish(topic, qos, false, body)
            .map_err(|e| format!("cannot publish: {e}"))?;
        let end = Instant::now() + timeout;
        let mut pkid: Option<u16> = None;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match conn.rx.recv_timeout(left) {
                Ok(Ev::Sent(p)) => pkid = Some(p),
                Ok(Ev::Acked(p)) if pkid == Some(p) => return Ok(()),
                Ok(Ev::Acked(_)) | Ok(Ev::Connected) => {}
                Ok(Ev::Down(e)) => return Err(format!("connection lost: {e}")),
                Err(_) => return Err(format!("no acknowledgement within {timeout:?}")),
            }
        }
    }
}

impl Transport for Mqtt {
    fn send(&mut self, seq: i64, ev: &AlertEvent) -> Outcome {
        let body = payload::mqtt(&self.device_id, seq, ev);
        match self.publish(body) {
            Ok(()) => Outcome::Ack,
            Err(reason) => {
                // A fresh connection next time; this one may hold a half-sent message.
                self.close();
                Outcome::unreachable(reason)
            }
        }
    }

    fn close(&mut self) {
        if let Some(c) = self.conn.take() {
            let _ = c.client.disconnect();
        }
    }
}
