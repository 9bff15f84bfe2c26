//! `[[process]]` (one watched process: a `name` or a `cmdline` pattern, and the `label` it
//! is stored under) and `[process_watch]` (the scan period and the restart window), with the
//! checks `check-config` runs on the list. A leaf: it imports only the shared value types
//! (`config::values`); it reads nothing.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::values::Interval;

/// `[[process]]`
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfig {
    /// The process name, matched exactly against the kernel's `comm` (at most 15
    /// characters) or the base name of `argv[0]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A command-line pattern: with `*` or `?` a glob over the whole command line (its
    /// arguments joined by spaces), else a substring of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// The `process` tag value (default: `name`, else the `cmdline` pattern).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl ProcessConfig {
    /// A rule on the process name (tests and examples).
    pub fn named(name: &str) -> ProcessConfig {
        ProcessConfig {
            name: Some(name.into()),
            ..ProcessConfig::default()
        }
    }

    /// A rule on the command line (tests and examples).
    pub fn cmdline(pattern: &str) -> ProcessConfig {
        ProcessConfig {
            cmdline: Some(pattern.into()),
            ..ProcessConfig::default()
        }
    }

    /// The tag value: `label`, else `name`, else the `cmdline` pattern.
    pub fn label(&self) -> String {
        self.label
            .clone()
            .or_else(|| self.name.clone())
            .or_else(|| self.cmdline.clone())
            .unwrap_or_default()
    }

    /// `name = "x"` or `cmdline = "x"`, as the status shows the rule.
    pub fn rule_text(&self) -> String {
        match (&self.name, &self.cmdline) {
            (Some(n), _) => format!("name = {n:?}"),
            (None, Some(c)) => format!("cmdline = {c:?}"),
            (None, None) => String::new(),
        }
    }
}

/// `[process_watch]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessWatchConfig {
    /// How often `/proc` is scanned (and a `process` point written per label).
    pub interval: Interval,
    /// An exit followed by a start of the same label within this long is a restart.
    pub restart_window: Interval,
}

impl Default for ProcessWatchConfig {
    fn default() -> Self {
        ProcessWatchConfig {
            interval: Interval(Duration::from_secs(5)),
            restart_window: Interval(Duration::from_secs(60)),
        }
    }
}

/// Checks the whole `[[process]]` list; the message names the table and the key.
pub fn validate_all(list: &[ProcessConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (i, p) in list.iter().enumerate() {
        let which = match (&p.label, &p.name, &p.cmdline) {
            (Some(l), _, _) => format!("[[process]] {l:?}"),
            (None, Some(n), _) => format!("[[process]] {n:?}"),
            (None, None, Some(c)) => format!("[[process]] {c:?}"),
            _ => format!("[[process]] #{}", i + 1),
        };
        match (&p.name, &p.cmdline) {
            (None, None) => {
                return Err(format!(
                    "{which}: set `name` (the process name) or `cmdline` (a command-line \
                     pattern)"
                ))
            }
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{which}: key `cmdline`: set either `name` or `cmdline`, not both"
                ))
            }
            _ => {}
        }
        for (key, v) in [
            ("name", &p.name),
            ("cmdline", &p.cmdline),
            ("label", &p.label),
        ] {
            if let Some(v) = v {
                if v.trim().is_empty() {
                    return Err(format!("{which}: key `{key}` must not be empty"));
                }
                if v.contains(['\n', '\r']) {
                    return Err(format!("{which}: key `{key}` must be one line"));
                }
            }
        }
        if let Some(n) = &p.name {
            if n.contains('/') {
                return Err(format!(
                    "{which}: key `name`: {n:?} holds a `/`: write the program's base name, or \
                     use `cmdline` for a path"
                ));
            }
        }
        if !seen.insert(p.label()) {
            return Err(format!(
                "{which}: key `label`: {:?} is used twice; give each [[process]] its own label",
                p.label()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_of_name_or_cmdline_and_unique_labels() {
        assert!(validate_all(&[
            ProcessConfig::named("tritonserver"),
            ProcessConfig::cmdline("python*serve.py*")
        ])
        .is_ok());
        let e = validate_all(&[ProcessConfig::default()]).unwrap_err();
        assert!(e.contains("[[process]] #1") && e.contains("`name`"), "{e}");
        let both = ProcessConfig {
            name: Some("a".into()),
            cmdline: Some("b".into()),
            label: None,
        };
        let e = validate_all(&[both]).unwrap_err();
        assert!(e.contains("`cmdline`") && e.contains("not both"), "{e}");
        let e = validate_all(&[ProcessConfig::named("a"), ProcessConfig::named("a")]).unwrap_err();
        assert!(e.contains("`label`"), "{e}");
        let e = validate_all(&[ProcessConfig::named("")]).unwrap_err();
        assert!(e.contains("`name` must not be empty"), "{e}");
        let e = validate_all(&[ProcessConfig::named("/usr/bin/x")]).unwrap_err();
        assert!(e.contains("`name`"), "{e}");
        let mut l = ProcessConfig::cmdline("x");
        assert_eq!(l.label(), "x");
        l.label = Some("srv".into());
        assert_eq!(l.label(), "srv");
        assert_eq!(l.rule_text(), "cmdline = \"x\"");
    }
}
