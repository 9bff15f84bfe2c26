//! What a reload changes: the old and the new effective config compared section by section
//! (as their TOML tables), each changed section mapped to the part of the agent that is
//! restarted with it, sinks compared one by one by `name`, and the keys that only a restart
//! applies listed. Pure: it starts and stops nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::Config;

/// A group of tasks restarted together when its section changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// `[host]`.
    Host,
    /// `[health]`.
    Health,
    /// `[[process]]`, `[process_watch]`.
    Process,
    /// `[jetson]`.
    Jetson,
    /// `[kmsg]`.
    Kmsg,
    /// `[tegrastats]`.
    Tegrastats,
    /// `[nvml]`.
    Nvml,
    /// `[[scrape]]`.
    Scrape,
    /// `[rollup]` (but its tiers), `[retention]`: the rollup job and its plan.
    Rollup,
    /// `[inference]` (read by the API: swapped, nothing restarts).
    Inference,
    /// `[alerts]`, `[[alert]]`: the evaluator (its instances are kept in the store).
    Alerts,
    /// `[[notify]]` and the outbox bounds: every notifier (positions kept by name).
    Notify,
    /// `[config]`: the file watcher.
    Watch,
}

impl Part {
    /// As the reload report names it.
    pub fn name(self) -> &'static str {
        match self {
            Part::Host => "host collector",
            Part::Health => "health collector",
            Part::Process => "process watch",
            Part::Jetson => "jetson collector",
            Part::Kmsg => "kmsg collector",
            Part::Tegrastats => "tegrastats collector",
            Part::Nvml => "nvml collector",
            Part::Scrape => "scrapes",
            Part::Rollup => "rollup, retention and disk budget",
            Part::Inference => "inference",
            Part::Alerts => "alert rules",
            Part::Notify => "notifiers",
            Part::Watch => "config watch",
        }
    }
}

/// The sinks to stop, start and restart, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkChanges {
    /// In the old config only (or now disabled): stopped; their stored position stays.
    pub stop: Vec<String>,
    /// In the new config only (or now enabled): started.
    pub start: Vec<String>,
    /// Changed: stopped and started again on their stored position.
    pub restart: Vec<String>,
}

/// Everything one reload changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Parts restarted (or swapped) with their new section.
    pub parts: BTreeSet<Part>,
    /// Sinks.
    pub sinks: SinkChanges,
    /// `device_id` or `[tags]` changed (every sink and notifier restarts with them).
    pub identity: bool,
    /// Changed keys that take effect only at a restart (`http.listen`).
    pub restart_required: Vec<String>,
}

/// Sections no running part can take in place: each changed key is reported.
const RESTART_ONLY: &[&str] = &["http", "udp", "storage", "ingest", "log", "clock"];

impl Changes {
    /// Nothing to apply and nothing to report.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
            && self.sinks == SinkChanges::default()
            && !self.identity
            && self.restart_required.is_empty()
    }

    /// What is applied in place, as the report lists it.
    pub fn applied(&self) -> Vec<String> {
        let mut out: Vec<String> = self.parts.iter().map(|p| p.name().to_string()).collect();
        if self.identity {
            out.push("device_id and [tags]".into());
        }
        out.extend(self.sinks.start.iter().map(|n| format!("sink {n} started")));
        out.extend(self.sinks.stop.iter().map(|n| format!("sink {n} stopped")));
        out.extend(
            self.sinks
                .restart
                .iter()
                .map(|n| format!("sink {n} restarted")),
        );
        out
    }
}

fn table(cfg: &Config) -> toml::Table {
    toml::Table::try_from(cfg).unwrap_or_default()
}

/// Keys of `a` and `b` (tables) whose values differ, as `section.key`.
fn changed_keys(section: &str, a: Option<&toml::Value>, b: Option<&toml::Value>) -> Vec<String> {
    match (a.and_then(|v| v.as_table()), b.and_then(|v| v.as_table())) {
        (Some(a), Some(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter()
                .filter(|k| a.get(*k) != b.get(*k))
                .map(|k| format!("{section}.{k}"))
                .collect()
        }
        _ => vec![section.to_string()],
    }
}

/// The enabled sinks of `cfg` by name, as tables.
fn sinks(t: &toml::Table) -> BTreeMap<String, toml::Value> {
    t.get("sink")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter(|s| s.get("enabled").and_then(|e| e.as_bool()).unwrap_or(true))
                .filter_map(|s| Some((s.get("name")?.as_str()?.to_string(), s.clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// `new` with the keys only a restart applies (the [`RESTART_ONLY`] sections, the rollup
/// tiers) as they run in `running`: what a reload applies.
pub fn pin(new: &Config, running: &Config) -> Config {
    let mut c = new.clone();
    c.http = running.http.clone();
    c.udp = running.udp.clone();
    c.storage = running.storage.clone();
    c.ingest = running.ingest.clone();
    c.log = running.log.clone();
    c.clock = running.clock.clone();
    c.rollup.tiers = running.rollup.tiers.clone();
    c
}

/// What changes from `old` to `new`.
pub fn changes(old: &Config, new: &Config) -> Changes {
    let (a, b) = (table(old), table(new));
    let mut c = Changes::default();
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut all_sinks = false;
    for key in keys {
        let (va, vb) = (a.get(key), b.get(key));
        if va == vb {
            continue;
        }
        let mut part = |p: Part| {
            c.parts.insert(p);
        };
        match key.as_str() {
            k if RESTART_ONLY.contains(&k) => {
                c.restart_required.extend(changed_keys(k, va, vb));
            }
            "rollup" => {
                for k in changed_keys("rollup", va, vb) {
                    match k.as_str() {
                        "rollup.tiers" => c.restart_required.push(k),
                        "rollup.lateness" => {
                            all_sinks = true;
                            part(Part::Rollup);
                        }
                        _ => part(Part::Rollup),
                    }
                }
            }
            "retention" => part(Part::Rollup),
            "host" => part(Part::Host),
            "health" => part(Part::Health),
            "process" | "process_watch" => part(Part::Process),
            "jetson" => part(Part::Jetson),
            "kmsg" => part(Part::Kmsg),
            "tegrastats" => part(Part::Tegrastats),
            "nvml" => part(Part::Nvml),
            "scrape" => part(Part::Scrape),
            "inference" => part(Part::Inference),
            "alert" => part(Part::Alerts),
            "alerts" => {
                part(Part::Alerts);
                // The outbox bounds are the notifiers' pruning.
                if changed_keys("alerts", va, vb)
                    .iter()
                    .any(|k| k.starts_with("alerts.outbox_"))
                {
                    part(Part::Notify);
                }
            }
            "notify" => part(Part::Notify),
            "config" => part(Part::Watch),
            "device_id" | "tags" => {
                c.identity = true;
                all_sinks = true;
                part(Part::Notify);
                part(Part::Alerts);
            }
            "sink" => {}
            other => c.restart_required.push(other.to_string()),
        }
    }
    // A sink that starts or stops reading a tier's rows changes how often the job folds it.
    let forwarded = |cfg: &Config| {
        crate::rollup::Plan::from_config(cfg)
            .map(|p| p.tiers.iter().map(|t| t.forwarded).collect::<Vec<_>>())
            .ok()
    };
    if forwarded(old) != forwarded(new) {
        c.parts.insert(Part::Rollup);
    }
    // The rollup plan is also what the evaluator's disk-budget rule reads.
    if c.parts.contains(&Part::Rollup) {
        c.parts.insert(Part::Alerts);
    }
    let (sa, sb) = (sinks(&a), sinks(&b));
    for (name, s) in &sb {
        match sa.get(name) {
            None => c.sinks.start.push(name.clone()),
            Some(old) if old != s || all_sinks => c.sinks.restart.push(name.clone()),
            Some(_) => {}
        }
    }
    c.sinks.stop = sa
        .keys()
        .filter(|n| !sb.contains_key(*n))
        .cloned()
        .collect();
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_toml_str(text, "t").unwrap()
    }

    const SINKS: &str =
        "[[sink]]\ntype = \"influxdb\"\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n\
        version = 1\ndatabase = \"e\"\n[[sink]]\ntype = \"influxdb\"\nname = \"b\"\n\
        url = \"http://127.0.0.1:2\"\nversion = 1\ndatabase = \"e\"\n";

    #[test]
    fn the_same_config_changes_nothing() {
        let a = cfg(SINKS);
        assert!(changes(&a, &a.clone()).is_empty());
    }

    #[test]
    fn a_changed_sink_restarts_alone_and_keeps_the_others() {
        let a = cfg(SINKS);
        let b = cfg(&SINKS.replace("127.0.0.1:2", "127.0.0.1:3"));
        let c = changes(&a, &b);
        assert_eq!(c.sinks.restart, vec!["b".to_string()]);
        assert!(c.sinks.start.is_empty() && c.sinks.stop.is_empty());
        assert!(c.parts.is_empty() && c.restart_required.is_empty());
        assert_eq!(c.applied(), vec!["sink b restarted".to_string()]);
    }

    #[test]
    fn added_removed_and_disabled_sinks_start_and_stop() {
        let a = cfg(SINKS);
        let one = "[[sink]]\ntype = \"influxdb\"\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n\
                   version = 1\ndatabase = \"e\"\n";
        let c = changes(&a, &cfg(one));
        assert_eq!(c.sinks.stop, vec!["b".to_string()]);
        let c = changes(&cfg(one), &a);
        assert_eq!(c.sinks.start, vec!["b".to_string()]);
        let off = SINKS.replace("name = \"b\"\n", "name = \"b\"\nenabled = false\n");
        let c = changes(&a, &cfg(&off));
        assert_eq!(c.sinks.stop, vec!["b".to_string()]);
    }

    #[test]
    fn tags_restart_every_sink_and_the_notifiers() {
        let a = cfg(SINKS);
        let b = cfg(&format!("[tags]\nsite = \"x\"\n{SINKS}"));
        let c = changes(&a, &b);
        assert!(c.identity);
        assert_eq!(c.sinks.restart, vec!["a".to_string(), "b".to_string()]);
        assert!(c.parts.contains(&Part::Notify) && c.parts.contains(&Part::Alerts));
    }

    #[test]
    fn listen_addresses_and_the_store_need_a_restart() {
        let a = cfg("");
        let b = cfg("[http]\nlisten = \"127.0.0.1:1\"\n[storage]\ndata_dir = \"/x\"\n[udp]\nlisten = \"127.0.0.1:2\"\n[rollup]\ntiers = [\"1m\"]\n[retention]\n1h = \"1d\"\n");
        let c = changes(&a, &b);
        assert_eq!(
            c.restart_required,
            vec![
                "http.listen",
                "rollup.tiers",
                "storage.data_dir",
                "udp.listen"
            ]
        );
        // The retention change itself applies.
        assert!(c.parts.contains(&Part::Rollup));
    }

    /// The job folds a tier a sink reads promptly: a sink that starts reading one restarts
    /// the job; another sink change does not.
    #[test]
    fn a_sink_that_reads_a_tier_restarts_the_rollup_job() {
        let sink = |extra: &str| {
            cfg(&format!(
                "[[sink]]\nname = \"a\"\ntype = \"influxdb\"\nurl = \"http://127.0.0.1:1\"\n\
                 version = 1\ndatabase = \"e\"\n{extra}"
            ))
        };
        let c = changes(&sink(""), &sink("forward = \"rollup:1m\"\n"));
        assert!(c.parts.contains(&Part::Rollup), "{c:?}");
        assert_eq!(c.sinks.restart, vec!["a".to_string()]);
        let c = changes(&sink(""), &sink("max_points = 10\n"));
        assert!(!c.parts.contains(&Part::Rollup), "{c:?}");
    }

    #[test]
    fn pinned_restart_keys_leave_only_what_applies() {
        let a = cfg("");
        let b = cfg("[http]\nlisten = \"127.0.0.1:1\"\n[host]\ninterval = \"3s\"\n");
        let c = changes(&a, &pin(&b, &a));
        assert!(c.restart_required.is_empty(), "{c:?}");
        assert_eq!(c.parts, BTreeSet::from([Part::Host]));
    }

    #[test]
    fn each_section_maps_to_its_part() {
        let a = cfg("");
        for (text, part) in [
            ("[host]\ninterval = \"3s\"\n", Part::Host),
            ("[health]\ninterval = \"3s\"\n", Part::Health),
            ("[kmsg]\nenabled = false\n", Part::Kmsg),
            ("[nvml]\nenabled = false\n", Part::Nvml),
            ("[jetson]\nenabled = false\n", Part::Jetson),
            ("[tegrastats]\nenabled = false\n", Part::Tegrastats),
            ("[retention]\nmax_bytes = 5\n", Part::Rollup),
            ("[alerts]\ninterval = \"3s\"\n", Part::Alerts),
            ("[config]\nwatch = true\n", Part::Watch),
            (
                "[[scrape]]\nname = \"s\"\nurl = \"http://127.0.0.1:9/metrics\"\n",
                Part::Scrape,
            ),
        ] {
            let c = changes(&a, &cfg(text));
            assert!(c.parts.contains(&part), "{text}: {c:?}");
            assert!(c.restart_required.is_empty(), "{text}: {c:?}");
        }
    }
}
