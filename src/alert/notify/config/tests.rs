//! `[[notify]]` tables: what is accepted, what is refused and how the message names it.

use super::*;

fn parse(t: &str) -> Result<NotifyConfig, String> {
    crate::deliver::parse_table(t, NotifyConfig::validate)
}

#[test]
fn minimal_notifiers_need_few_keys() {
    let a =
        parse("type = \"alertmanager\"\nname = \"am\"\nurl = \"http://127.0.0.1:9093\"\n").unwrap();
    assert_eq!(a.resend_interval(), Duration::from_secs(60));
    assert!(a.enabled);
    let m = parse(
        "type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h:1883\"\ntopic = \"e/{device_id}/alerts\"\n",
    )
    .unwrap();
    assert_eq!(m.qos, None);
    let w = parse("type = \"webhook\"\nname = \"w\"\nurl = \"https://ops.example/hook\"\nbearer_token = \"t0k\"\n[headers]\nX-Team = \"edge\"\n").unwrap();
    assert_eq!(w.headers["X-Team"], "edge");
    assert!(!format!("{w:?}").contains("t0k"), "token redacted");
}

#[test]
fn wrong_or_missing_keys_are_named() {
    let cases = [
        ("type = \"pager\"\nname = \"p\"\nurl = \"http://h\"\n", "pager"),
        ("type = \"webhook\"\nname = \"w\"\n", "url"),
        ("type = \"webhook\"\nname = \"w\"\nurl = \"mqtt://h\"\n", "http://"),
        ("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nurll = 1\n", "urll"),
        ("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\ntopic = \"t\"\n", "topic"),
        ("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nresend_interval = \"1m\"\n", "resend_interval"),
        ("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\n", "topic"),
        ("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nqos = 0\n", "qos"),
        ("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nbearer_token = \"x\"\n", "bearer_token"),
        ("type = \"alertmanager\"\nname = \"a\"\nurl = \"http://h\"\nresend_interval = \"0s\"\n", "greater than zero"),
        ("type = \"alertmanager\"\nname = \"a\"\nurl = \"http://h\"\npassword = \"x\"\n", "username"),
        ("type = \"alertmanager\"\nname = \"\"\nurl = \"http://h\"\n", "name"),
    ];
    for (text, key) in cases {
        let e = parse(text).unwrap_err();
        assert!(e.contains(key), "{text:?}: {e}");
    }
}

#[test]
fn duplicate_names_and_bad_tables_name_their_lines() {
    let text = "device_id = \"d\"\n\n[[notify]]\ntype = \"webhook\"\nname = \"x\"\nurl = \"http://h\"\n\n  [[ notify ]]\ntype = \"webhook\"\nname = \"x\"\nurl = \"http://h2\"\n";
    #[derive(Deserialize)]
    struct T {
        notify: Vec<NotifyConfig>,
    }
    let t: T = toml::from_str(&text.replace("device_id = \"d\"\n", "")).unwrap();
    let e = validate_all(&t.notify, text).unwrap_err();
    assert!(
        e.contains("\"x\" (line 8) is used twice (first (line 3))"),
        "{e}"
    );
    let bad = text.replace("http://h2", "ftp://h2");
    let t: T = toml::from_str(&bad.replace("device_id = \"d\"\n", "")).unwrap();
    let e = validate_all(&t.notify, &bad).unwrap_err();
    assert!(e.contains("ftp://h2") && e.contains("(line 8)"), "{e}");
}

#[test]
fn retries_double_with_equal_jitter_up_to_the_cap() {
    let c = parse("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nmin_backoff = \"100ms\"\nmax_backoff = \"1s\"\n").unwrap();
    assert_eq!(c.retry_delay(1, 0.0), Duration::from_millis(50));
    assert_eq!(c.retry_delay(9, 0.0), Duration::from_millis(500));
    assert!(c.retry_delay(9, 0.99) < Duration::from_secs(1));
    // One declaration with the sinks' (crate::deliver::Retry): the same checks.
    let e = parse("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nmin_backoff = \"2s\"\nmax_backoff = \"1s\"\n").unwrap_err();
    assert!(e.contains("min_backoff") && e.contains("\"w\""), "{e}");
    let e = parse("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\ntimeout = \"soon\"\n")
        .unwrap_err();
    assert!(e.contains("timeout"), "{e}");
    // MQTT takes client certificates and a keepalive like the sink.
    let c = parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtts://h\"\ntopic = \"t\"\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nkeepalive = \"15s\"\n").unwrap();
    assert_eq!(c.tls_files().cert_file, Some("c.pem"));
    let e = parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtts://h\"\ntopic = \"t\"\ncert_file = \"c.pem\"\n").unwrap_err();
    assert!(e.contains("key_file"), "{e}");
    let e = parse("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nkeepalive = \"15s\"\n")
        .unwrap_err();
    assert!(e.contains("keepalive"), "{e}");
}
