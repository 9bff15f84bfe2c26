//! `[[scrape]]`: one Prometheus endpoint to scrape, and the checks `check-config` runs on
//! the list. Only types, defaults and validation; it reads nothing and connects nowhere.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::values::{Delay, Interval, Secret};

/// Default body limit per scrape: 10 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 10 * 1024 * 1024;

/// `[[scrape]]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScrapeConfig {
    /// Unique; stored as the tag `scrape`.
    pub name: String,
    /// `http://` or `https://` URL of the exposition.
    pub url: String,
    /// How often.
    #[serde(default = "default_interval")]
    pub interval: Interval,
    /// Whole-request limit (connect, headers, body); at most `interval`. Unset: the smaller
    /// of 3 s and `interval` (as Prometheus), see [`ScrapeConfig::timeout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Delay>,
    /// Metric-name globs (`*`, `?`) to keep; empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Metric-name globs to drop (after `include`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Sent as `Authorization: Bearer ...` when set.
    #[serde(default, skip_serializing_if = "Secret::is_empty")]
    pub bearer_token: Secret,
    /// Extra tags on every point of this target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// A body larger than this is refused (the scrape counts as failed).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: u64,
    /// `vllm` or `llamacpp`: also write one `llm` point per model per interval (see
    /// [`super::llm`]). Unset: only the samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// The `model` tag of the `llm` points when the page names no model (llama.cpp never
    /// does). Unset: the target's `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

fn default_interval() -> Interval {
    Interval(Duration::from_secs(10))
}

/// The timeout of a target that sets none, when its interval is longer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

fn default_max_body() -> u64 {
    DEFAULT_MAX_BODY_BYTES
}

impl ScrapeConfig {
    /// A target with the defaults (tests and examples).
    pub fn new(name: &str, url: &str) -> ScrapeConfig {
        ScrapeConfig {
            name: name.into(),
            url: url.into(),
            interval: default_interval(),
            timeout: None,
            include: Vec::new(),
            exclude: Vec::new(),
            bearer_token: Secret::default(),
            tags: BTreeMap::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            preset: None,
            model: None,
        }
    }

    /// The effective whole-request limit: `timeout` when set, else the smaller of
    /// [`DEFAULT_TIMEOUT`] and the interval.
    pub fn timeout(&self) -> Duration {
        match self.timeout {
            Some(t) => t.0,
            None => DEFAULT_TIMEOUT.min(self.interval.0),
        }
    }

    /// Whether a sample named `name` is kept by `include` / `exclude`.
    pub fn keeps(&self, name: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| glob_match(g, name)))
            && !self.exclude.iter().any(|g| glob_match(g, name))
    }
}

/// `*` (any run, also empty) and `?` (one character) globs; everything else literal.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let g: Vec<char> = glob.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut gi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == n[ni]) {
            gi += 1;
            ni += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some((gi, ni));
            gi += 1;
        } else if let Some((sg, sn)) = star {
            gi = sg + 1;
            ni = sn + 1;
            star = Some((sg, sn + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|c| *c == '*')
}

/// Checks the whole `[[scrape]]` list; the message names the target and says what to fix.
pub fn validate_all(targets: &[ScrapeConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (i, t) in targets.iter().enumerate() {
        let which = if t.name.is_empty() {
            format!("[[scrape]] #{}", i + 1)
        } else {
            format!("[[scrape]] {:?}", t.name)
        };
        if t.name.trim().is_empty() {
            return Err(format!("{which}: `name` must not be empty"));
        }
        if !seen.insert(t.name.as_str()) {
            return Err(format!(
                "{which}: the name is used twice; each [[scrape]] needs its own name"
            ));
        }
        let lower = t.url.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("http://")
            .or_else(|| lower.strip_prefix("https://"));
        match rest {
            Some(host) if !host.is_empty() && !host.starts_with('/') => {}
            _ => {
                return Err(format!(
                    "{which}: url {:?} must be an http:// or https:// URL with a host \
                     (e.g. \"http://127.0.0.1:8002/metrics\")",
                    t.url
                ))
            }
        }
        if t.timeout().is_zero() || t.timeout() > t.interval.0 {
            return Err(format!(
                "{which}: timeout must be above zero and at most the interval ({})",
                humantime::format_duration(t.interval.0)
            ));
        }
        if t.max_body_bytes == 0 {
            return Err(format!("{which}: max_body_bytes must be above zero"));
        }
        if t.tags.contains_key("scrape") {
            return Err(format!(
                "{which}: the tag `scrape` is set by the agent (the target's name); \
                 remove it from `tags`"
            ));
        }
        for g in t.include.iter().chain(&t.exclude) {
            if g.is_empty() {
                return Err(format!("{which}: an empty glob in include/exclude"));
            }
        }
        if let Some(p) = &t.preset {
            if super::llm::Preset::from_name(p).is_none() {
                return Err(format!(
                    "{which}: preset {p:?} is not known; use one of {} (or leave `preset` out)",
                    super::llm::Preset::ALLOWED
                ));
            }
        }
        if t.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err(format!(
                "{which}: `model` must not be empty (leave it out to use the target's name)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("nv_*", "nv_inference_count"));
        assert!(glob_match("*_bucket", "h_bucket"));
        assert!(glob_match("a?c", "abc"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("nv_*", "node_cpu"));
        assert!(!glob_match("a*b", "acbc"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        let mut t = ScrapeConfig::new("t", "http://127.0.0.1:1/metrics");
        t.include = vec!["nv_*".into()];
        t.exclude = vec!["nv_gpu_*".into()];
        assert!(t.keeps("nv_inference_count"));
        assert!(!t.keeps("nv_gpu_utilization"));
        assert!(!t.keeps("go_gc"));
    }

    #[test]
    fn validation_names_the_target_and_the_fix() {
        let ok = ScrapeConfig::new("a", "http://127.0.0.1:9100/metrics");
        assert_eq!(validate_all(std::slice::from_ref(&ok)), Ok(()));
        let cases: Vec<(ScrapeConfig, &str)> = vec![
            (
                ScrapeConfig::new("", "http://x/"),
                "`name` must not be empty",
            ),
            (
                ScrapeConfig::new("b", "ftp://x/"),
                "must be an http:// or https:// URL",
            ),
            (
                ScrapeConfig::new("b", "http:///m"),
                "must be an http:// or https:// URL",
            ),
            (
                ScrapeConfig {
                    timeout: Some(Interval(Duration::from_secs(20))),
                    ..ScrapeConfig::new("b", "http://x/")
                },
                "timeout must be above zero and at most the interval (10s)",
            ),
            (
                ScrapeConfig {
                    interval: Interval(Duration::from_secs(1)),
                    timeout: Some(Interval(Duration::from_secs(2))),
                    ..ScrapeConfig::new("b", "http://x/")
                },
                "timeout must be above zero and at most the interval (1s)",
            ),
            (
                ScrapeConfig {
                    tags: [("scrape".to_string(), "x".to_string())].into(),
                    ..ScrapeConfig::new("b", "http://x/")
                },
                "the tag `scrape` is set by the agent",
            ),
            (
                ScrapeConfig {
                    preset: Some("tgi".into()),
                    ..ScrapeConfig::new("b", "http://x/")
                },
                "[[scrape]] \"b\": preset \"tgi\" is not known; use one of \"vllm\", \"llamacpp\"",
            ),
            (
                ScrapeConfig {
                    model: Some(" ".into()),
                    ..ScrapeConfig::new("b", "http://x/")
                },
                "`model` must not be empty",
            ),
        ];
        for (c, want) in cases {
            let e = validate_all(&[c]).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let e = validate_all(&[ok.clone(), ok]).unwrap_err();
        assert!(
            e.contains("[[scrape]] \"a\": the name is used twice"),
            "{e}"
        );
    }

    /// As Prometheus: an unset timeout is the smaller of 3 s and the interval, so a fast
    /// target needs no `timeout`; one set above the interval is still refused.
    #[test]
    fn an_unset_timeout_follows_a_short_interval() {
        let t: ScrapeConfig =
            toml::from_str("name = \"a\"\nurl = \"http://x/\"\ninterval = \"1s\"\n").unwrap();
        assert_eq!(t.timeout, None);
        assert_eq!(t.timeout(), Duration::from_secs(1));
        assert_eq!(validate_all(std::slice::from_ref(&t)), Ok(()));
        let t: ScrapeConfig =
            toml::from_str("name = \"a\"\nurl = \"http://x/\"\ninterval = \"500ms\"\n").unwrap();
        assert_eq!(t.timeout(), Duration::from_millis(500));
        assert_eq!(validate_all(&[t]), Ok(()));
        let t: ScrapeConfig = toml::from_str("name = \"a\"\nurl = \"http://x/\"\n").unwrap();
        assert_eq!(t.timeout(), Duration::from_secs(3));
        let t: ScrapeConfig = toml::from_str(
            "name = \"a\"\nurl = \"http://x/\"\ninterval = \"1s\"\ntimeout = \"1s\"\n",
        )
        .unwrap();
        assert_eq!(t.timeout(), Duration::from_secs(1));
        assert_eq!(validate_all(&[t]), Ok(()));
    }

    #[test]
    fn reads_the_documented_example() {
        let t: ScrapeConfig = toml::from_str(
            "name = \"triton\"\nurl = \"http://127.0.0.1:8002/metrics\"\ninterval = \"10s\"\n\
             timeout = \"3s\"\ninclude = [\"nv_*\"]\nbearer_token = \"\"\n\
             tags = { role = \"server\" }\n",
        )
        .unwrap();
        assert_eq!(t.tags["role"], "server");
        assert_eq!(t.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        assert!(toml::from_str::<ScrapeConfig>("name=\"a\"\nurl=\"http://x/\"\nbogus=1").is_err());
        let t: ScrapeConfig = toml::from_str(
            "name = \"llm\"\nurl = \"http://127.0.0.1:8080/metrics\"\npreset = \"llamacpp\"\n\
             model = \"qwen2.5-1.5b-q4\"\n",
        )
        .unwrap();
        assert_eq!(t.preset.as_deref(), Some("llamacpp"));
        assert_eq!(t.model.as_deref(), Some("qwen2.5-1.5b-q4"));
        assert_eq!(validate_all(&[t]), Ok(()));
    }
}
