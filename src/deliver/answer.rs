//! What a peer's answer means: one classification of HTTP answers for every sink and
//! notifier, with the small policy that differs by peer kind (pure; the current time is an
//! argument where a `Retry-After` date needs it).

use std::time::{Duration, SystemTime};

/// Who is delivering: the one place the policy differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A `[[sink]]`: batches of points, which can be split.
    Sink,
    /// A `[[notify]]`: one alert event per request, which cannot be split.
    Notifier,
}

/// What to do after the peer answered (or did not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Stored: move the position.
    Ack,
    /// The peer says this content is bad and will never take it (400, 422): keep it aside
    /// with the reason (dead letter) and move on.
    DeadLetter {
        /// HTTP status.
        status: u16,
        /// The peer's reason.
        reason: String,
    },
    /// The peer refuses for a reason that does not go away by itself (credentials, a wrong
    /// path, a body it will never take, another 4xx): keep the data, show the reason, try
    /// again every `max_backoff`.
    Pause {
        /// HTTP status.
        status: u16,
        /// What to tell the user.
        reason: String,
    },
    /// The batch is too large for the peer (413 to a sink): send it in smaller parts.
    Shrink {
        /// The peer's reason.
        reason: String,
    },
    /// Overloaded (429, 503) with a `Retry-After`: wait that long.
    RetryAfter {
        /// How long.
        after: Duration,
        /// Status line.
        reason: String,
    },
    /// Anything else (408, 5xx, timeouts, connection errors): back off and retry.
    Retry {
        /// What failed.
        reason: String,
        /// True when the peer could not be reached at all (no answer).
        unreachable: bool,
    },
}

impl Outcome {
    /// A transport failure: the peer was not reached.
    pub fn unreachable(reason: String) -> Outcome {
        Outcome::Retry {
            reason,
            unreachable: true,
        }
    }
}

/// The longest wait a `Retry-After` can impose (a misconfigured proxy must not silence a
/// peer for days).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Parses a `Retry-After` value, delay-seconds (ASCII digits only) or an HTTP date (RFC
/// 9110: IMF-fixdate and the two obsolete forms), into a wait from `now`: a date in the past
/// waits zero; any wait is capped at [`MAX_RETRY_AFTER`]. `None` when it is neither.
pub fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    let wait = if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "a very long wait".
        Duration::from_secs(v.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        httpdate::parse_http_date(v)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// Classifies an HTTP answer from a peer of kind `peer` (see the policy table in
/// [`crate::deliver`]).
pub fn classify(peer: Peer, status: u16, retry_after: Option<&str>, body: &str) -> Outcome {
    let body = body.trim();
    let reason = if body.is_empty() {
        format!("HTTP {status}")
    } else {
        format!(
            "HTTP {status}: {}",
            body.chars().take(400).collect::<String>()
        )
    };
    let kept = match peer {
        Peer::Sink => "data is kept",
        Peer::Notifier => "events are kept",
    };
    let pause = |why: &str| Outcome::Pause {
        status,
        reason: format!("{reason} ({why}; {kept})"),
    };
    match status {
        200..=299 => Outcome::Ack,
        400 | 422 => Outcome::DeadLetter { status, reason },
        401 | 403 | 407 => pause("credentials refused: check username/password or the token"),
        404 | 405 | 410 => pause("no such endpoint: check the url and its path"),
        413 => match peer {
            Peer::Sink => Outcome::Shrink { reason },
            Peer::Notifier => pause("the receiver's body limit is below one event: raise it"),
        },
        429 | 503 => match retry_after.and_then(|v| parse_retry_after(v, SystemTime::now())) {
            Some(after) => Outcome::RetryAfter { after, reason },
            None => Outcome::Retry {
                reason,
                unreachable: false,
            },
        },
        // A Prometheus started without native histograms says so in a 500; retrying cannot
        // change that, only the operator can: pause with the fix, like a wrong path.
        500 if body.contains("native histograms are disabled") => pause(
            "start Prometheus with --enable-feature=native-histograms, or set histogram_format = \"vmrange\" for VictoriaMetrics",
        ),
        408 | 500..=599 => Outcome::Retry {
            reason,
            unreachable: false,
        },
        _ => pause("refused"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_histograms_disabled_pauses_with_the_fix() {
        let o = classify(Peer::Sink, 500, None, "native histograms are disabled\n");
        match o {
            Outcome::Pause { status, reason } => {
                assert_eq!(status, 500);
                assert!(
                    reason.contains("--enable-feature=native-histograms"),
                    "{reason}"
                );
                assert!(reason.contains("data is kept"), "{reason}");
            }
            o => panic!("{o:?}"),
        }
        // Any other 500 is still a backoff.
        assert!(matches!(
            classify(Peer::Sink, 500, None, "out of memory"),
            Outcome::Retry { .. }
        ));
    }

    #[test]
    fn the_policy_table_holds_for_both_peers() {
        for peer in [Peer::Sink, Peer::Notifier] {
            assert_eq!(classify(peer, 204, None, ""), Outcome::Ack);
            assert_eq!(classify(peer, 200, None, ""), Outcome::Ack);
            for s in [400, 422] {
                assert!(
                    matches!(classify(peer, s, None, "{\"error\":\"bad\"}"), Outcome::DeadLetter { status, reason } if status == s && reason.contains("bad")),
                    "{s}"
                );
            }
            // Never dropped: credentials, a wrong path, an unknown 4xx.
            for s in [401, 403, 407, 404, 405, 410, 409, 418] {
                assert!(
                    matches!(classify(peer, s, None, ""), Outcome::Pause { status, reason } if status == s && reason.contains("kept")),
                    "{peer:?} {s}"
                );
            }
            assert!(matches!(
                classify(peer, 404, None, "page not found"),
                Outcome::Pause { reason, .. } if reason.contains("check the url")
            ));
            for s in [408, 500, 502, 504] {
                assert!(
                    matches!(
                        classify(peer, s, None, ""),
                        Outcome::Retry {
                            unreachable: false,
                            ..
                        }
                    ),
                    "{s}"
                );
            }
            assert_eq!(
                classify(peer, 429, Some("7"), ""),
                Outcome::RetryAfter {
                    after: Duration::from_secs(7),
                    reason: "HTTP 429".into()
                }
            );
            // A date in the past: retry at once, as the server asked.
            assert_eq!(
                classify(peer, 503, Some("Wed, 21 Oct 2015 07:28:00 GMT"), ""),
                Outcome::RetryAfter {
                    after: Duration::ZERO,
                    reason: "HTTP 503".into()
                }
            );
            assert!(matches!(
                classify(peer, 503, Some("soon"), ""),
                Outcome::Retry { .. }
            ));
            assert!(matches!(
                classify(peer, 503, None, ""),
                Outcome::Retry { .. }
            ));
        }
        // The one difference: a sink can split a batch, a notifier cannot split an event.
        assert!(matches!(
            classify(Peer::Sink, 413, None, ""),
            Outcome::Shrink { .. }
        ));
        assert!(matches!(
            classify(Peer::Notifier, 413, None, ""),
            Outcome::Pause { status: 413, .. }
        ));
    }

    #[test]
    fn retry_after_takes_ascii_seconds_and_http_dates_and_is_capped() {
        use std::time::UNIX_EPOCH;
        // Wed, 21 Oct 2015 07:28:00 GMT
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let p = |v| parse_retry_after(v, now);
        assert_eq!(p(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(p("0"), Some(Duration::ZERO));
        assert_eq!(
            p("Wed, 21 Oct 2015 07:29:30 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            p("Wednesday, 21-Oct-15 07:28:10 GMT"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(p("Wed Oct 21 07:28:05 2015"), Some(Duration::from_secs(5)));
        assert_eq!(p("Wed, 21 Oct 2015 07:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(p("999999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(p("99999999999999999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(p("Thu, 22 Oct 2015 07:28:00 GMT"), Some(MAX_RETRY_AFTER));
        assert_eq!(p("+5"), None);
        assert_eq!(p("-5"), None);
        assert_eq!(p("1.5"), None);
        assert_eq!(p("\u{0663}"), None, "an Arabic-Indic digit is not a delay");
        assert_eq!(p(""), None);
        assert_eq!(p("in a minute"), None);
    }
}
