//! The log filter of `[log] level` and `RUST_LOG`: a comma-separated list of `level` and
//! `target=level` directives ("info", "edgewatch=debug,warn", "edgewatch::forward=trace"),
//! parsed into tracing-subscriber's `Targets` filter, which matches target prefixes and needs
//! no regular expressions (the `env-filter` feature's span and field filters, e.g.
//! `edgewatch[{peer}]=debug`, are not supported). It checks the text when the config is read,
//! so a bad filter is a config error naming the key instead of a silent fallback; it never
//! installs a subscriber (`src/main.rs` does) and never reads the environment itself.

use tracing_subscriber::filter::{LevelFilter, Targets};

/// Why a log filter was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogFilterError {
    /// Nothing but commas and spaces.
    #[error("empty log filter (write a level such as \"info\")")]
    Empty,
    /// A directive tracing-subscriber cannot read.
    #[error(
        "invalid log filter {text:?}: {reason} (write a level such as \"info\", or \
         target=level pairs such as \"edgewatch=debug,warn\")"
    )]
    Invalid {
        /// As written.
        text: String,
        /// tracing-subscriber's reason.
        reason: String,
    },
    /// A span or field filter (`target[span{field}]=level`), which `env-filter` read and
    /// this filter does not.
    #[error(
        "invalid log filter {text:?}: span and field filters ('[') are not supported; \
         write target=level pairs such as \"edgewatch=debug,warn\""
    )]
    SpanFilter {
        /// As written.
        text: String,
    },
}

/// Parses a log filter: directives separated by commas, spaces around them ignored, empty
/// ones skipped; a bare level is the default for every target.
pub fn parse_filter(text: &str) -> Result<Targets, LogFilterError> {
    let directives: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err(LogFilterError::Empty);
    }
    if directives.iter().any(|d| d.contains('[')) {
        return Err(LogFilterError::SpanFilter {
            text: text.to_string(),
        });
    }
    directives
        .join(",")
        .parse::<Targets>()
        .map_err(|e| LogFilterError::Invalid {
            text: text.to_string(),
            reason: e.to_string(),
        })
}

/// The filter the agent logs with: `RUST_LOG` when it is set, not blank and valid, else the
/// config's level (checked when the config was read), else "info". The second value is the
/// reason `RUST_LOG` was ignored, for the caller to log once a subscriber exists.
pub fn effective_filter(rust_log: Option<&str>, level: &str) -> (Targets, Option<LogFilterError>) {
    let mut ignored = None;
    if let Some(env) = rust_log.filter(|s| !s.trim().is_empty()) {
        match parse_filter(env) {
            Ok(f) => return (f, None),
            Err(e) => ignored = Some(e),
        }
    }
    let filter =
        parse_filter(level).unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO));
    (filter, ignored)
}

/// serde's `deserialize_with` for `[log] level`: the text, refused when it is not a filter.
pub fn deserialize_level<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = <String as serde::Deserialize>::deserialize(d)?;
    parse_filter(&s).map_err(serde::de::Error::custom)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn levels_and_target_pairs_filter_like_env_filter_did() {
        let f = parse_filter("info").unwrap();
        assert!(f.would_enable("edgewatch::forward", &Level::INFO));
        assert!(!f.would_enable("edgewatch::forward", &Level::DEBUG));

        let f = parse_filter(" edgewatch=debug , warn ,").unwrap();
        assert!(f.would_enable("edgewatch::forward::mqtt", &Level::DEBUG));
        assert!(!f.would_enable("edgewatch::forward::mqtt", &Level::TRACE));
        assert!(f.would_enable("hyper::proto", &Level::WARN));
        assert!(!f.would_enable("hyper::proto", &Level::INFO));

        let f = parse_filter("edgewatch::forward=trace,error").unwrap();
        assert!(f.would_enable("edgewatch::forward::influx", &Level::TRACE));
        assert!(!f.would_enable("edgewatch::store", &Level::WARN));

        let f = parse_filter("off").unwrap();
        assert!(!f.would_enable("edgewatch", &Level::ERROR));
        assert!(parse_filter("WARN")
            .unwrap()
            .would_enable("x", &Level::WARN));
    }

    #[test]
    fn bad_filters_are_refused_with_the_reason() {
        assert_eq!(parse_filter(" , "), Err(LogFilterError::Empty));
        let e = parse_filter("edgewatch=loud").unwrap_err();
        assert!(matches!(e, LogFilterError::Invalid { .. }), "{e:?}");
        assert!(e.to_string().contains("\"edgewatch=loud\""), "{e}");
        let e = parse_filter("a=b=c").unwrap_err().to_string();
        assert!(e.contains("too many '='"), "{e}");
        let e = parse_filter("edgewatch[{peer}]=debug").unwrap_err();
        assert!(matches!(e, LogFilterError::SpanFilter { .. }), "{e:?}");
    }

    #[test]
    fn rust_log_wins_when_valid_and_is_reported_when_not() {
        let (f, ignored) = effective_filter(Some("edgewatch=trace"), "warn");
        assert!(ignored.is_none());
        assert!(f.would_enable("edgewatch::api", &Level::TRACE));
        assert!(!f.would_enable("hyper", &Level::ERROR));

        let (f, ignored) = effective_filter(Some("x=nope"), "warn");
        assert!(matches!(ignored, Some(LogFilterError::Invalid { .. })));
        assert!(f.would_enable("edgewatch", &Level::WARN));
        assert!(!f.would_enable("edgewatch", &Level::INFO));

        let (f, ignored) = effective_filter(Some("  "), "debug");
        assert!(ignored.is_none());
        assert!(f.would_enable("edgewatch", &Level::DEBUG));
    }
}
