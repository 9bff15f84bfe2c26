//! Merging a fleet fragment over a config table, key by key: tables merge recursively, other
//! values replace, and the named arrays (`[[alert]]`, `[[notify]]`, `[[sink]]`, `[[scrape]]`,
//! `[[process]]`) merge entry by entry on `name` (an entry with `enabled = false` removes
//! the one of that name). The sections that decide where data goes and who can reach the
//! device (`[fleet]`, `[http]`, `[udp]`, `[storage]`) are refused unless the local file's
//! `[fleet] allow` lists them. Pure: tables in, tables out; validation of the result as a
//! config is the caller's.

use std::collections::BTreeMap;

use toml::{Table, Value};

/// Arrays of tables merged by `name`.
pub const NAMED_ARRAYS: [&str; 5] = ["alert", "notify", "sink", "scrape", "process"];

/// Sections a fragment may change only when the local file allows it.
pub const LOCKED: [&str; 4] = ["fleet", "http", "udp", "storage"];

/// Refuses a fragment that sets a locked section not in `allow`; the message names it.
pub fn check_locked(fragment: &Table, allow: &[String]) -> Result<(), String> {
    for key in fragment.keys() {
        if LOCKED.contains(&key.as_str()) && !allow.iter().any(|a| a == key) {
            return Err(format!(
                "the fragment sets [{key}], which is locked: the local file must list \"{key}\" in [fleet] allow"
            ));
        }
    }
    Ok(())
}

/// Merges `fragment` (from layer `source`) over `base`, recording each key it sets.
pub fn merge(
    base: &mut Table,
    fragment: &Table,
    source: &str,
    set_by: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    for (key, value) in fragment {
        if NAMED_ARRAYS.contains(&key.as_str()) {
            merge_named(base, key, value, source, set_by)?;
        } else {
            merge_value(base, key, value, key, source, set_by);
        }
    }
    Ok(())
}

fn merge_value(
    base: &mut Table,
    key: &str,
    value: &Value,
    path: &str,
    source: &str,
    set_by: &mut BTreeMap<String, String>,
) {
    match (base.get_mut(key), value) {
        (Some(Value::Table(b)), Value::Table(f)) => {
            for (k, v) in f {
                merge_value(b, k, v, &format!("{path}.{k}"), source, set_by);
            }
        }
        _ => {
            forget(set_by, path);
            record(value, path, source, set_by);
            base.insert(key.to_string(), value.clone());
        }
    }
}

/// Records every leaf of `value` under `path`.
fn record(value: &Value, path: &str, source: &str, set_by: &mut BTreeMap<String, String>) {
    match value {
        Value::Table(t) if !t.is_empty() => {
            for (k, v) in t {
                record(v, &format!("{path}.{k}"), source, set_by);
            }
        }
        _ => {
            set_by.insert(path.to_string(), source.to_string());
        }
    }
}

/// Forgets `path` and every key below it (the value there is replaced or removed).
fn forget(set_by: &mut BTreeMap<String, String>, path: &str) {
    let below = format!("{path}.");
    set_by.retain(|k, _| k != path && !k.starts_with(&below));
}

fn entry_name<'a>(entry: &'a Value, key: &str) -> Result<&'a str, String> {
    entry
        .as_table()
        .ok_or_else(|| format!("[[{key}]] entries must be tables"))?
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            format!("every [[{key}]] in a fragment needs a `name` (entries merge by name)")
        })
}

fn merge_named(
    base: &mut Table,
    key: &str,
    value: &Value,
    source: &str,
    set_by: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    let entries = value
        .as_array()
        .ok_or_else(|| format!("`{key}` must be an array of tables ([[{key}]])"))?;
    let list = base
        .entry(key.to_string())
        .or_insert_with(|| Value::Array(Vec::new()));
    let list = list
        .as_array_mut()
        .ok_or_else(|| format!("`{key}` in the lower layers is not an array of tables"))?;
    for entry in entries {
        let name = entry_name(entry, key)?.to_string();
        let at = list
            .iter()
            .position(|e| e.get("name").and_then(Value::as_str) == Some(name.as_str()));
        let path = format!("{key}.{name}");
        forget(set_by, &path);
        let remove = entry.get("enabled").and_then(Value::as_bool) == Some(false);
        match (at, remove) {
            (Some(i), true) => {
                list.remove(i);
                set_by.insert(path, source.to_string());
            }
            (None, true) => {
                set_by.insert(path, source.to_string());
            }
            (Some(i), false) => {
                record(entry, &path, source, set_by);
                list[i] = entry.clone();
            }
            (None, false) => {
                record(entry, &path, source, set_by);
                list.push(entry.clone());
            }
        }
    }
    if list.is_empty() {
        base.remove(key);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Table {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn keys_merge_one_by_one_and_say_who_set_them() {
        let mut base = t("[host]\nenabled = true\ninterval = \"10s\"\n[tags]\nsite = \"a\"\n");
        let mut by = BTreeMap::new();
        merge(&mut base, &t("[host]\ninterval = \"5s\"\n"), "all", &mut by).unwrap();
        merge(
            &mut base,
            &t("[tags]\nrack = \"3\"\n"),
            "group:lab",
            &mut by,
        )
        .unwrap();
        assert_eq!(base["host"]["interval"].as_str(), Some("5s"));
        assert_eq!(base["host"]["enabled"].as_bool(), Some(true));
        assert_eq!(base["tags"]["site"].as_str(), Some("a"));
        assert_eq!(base["tags"]["rack"].as_str(), Some("3"));
        assert_eq!(by["host.interval"], "all");
        assert_eq!(by["tags.rack"], "group:lab");
        assert!(!by.contains_key("host.enabled"));
        // A higher layer wins.
        merge(
            &mut base,
            &t("[host]\ninterval = \"1s\"\n"),
            "device",
            &mut by,
        )
        .unwrap();
        assert_eq!(base["host"]["interval"].as_str(), Some("1s"));
        assert_eq!(by["host.interval"], "device");
    }

    #[test]
    fn named_entries_are_added_replaced_and_removed() {
        let mut base =
            t("[[alert]]\nname = \"a\"\nexpr = \"x\"\n[[alert]]\nname = \"b\"\nexpr = \"y\"\n");
        let mut by = BTreeMap::new();
        let frag = t("[[alert]]\nname = \"b\"\nexpr = \"y2\"\n[[alert]]\nname = \"c\"\nexpr = \"z\"\n[[alert]]\nname = \"a\"\nenabled = false\n");
        merge(&mut base, &frag, "all", &mut by).unwrap();
        let names: Vec<&str> = base["alert"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(base["alert"][0]["expr"].as_str(), Some("y2"));
        assert_eq!(by["alert.b.expr"], "all");
        assert_eq!(by["alert.a"], "all");
        // Removing the last one leaves no array at all.
        let mut base = t("[[sink]]\nname = \"s\"\ntype = \"mqtt\"\n");
        merge(
            &mut base,
            &t("[[sink]]\nname = \"s\"\nenabled = false\n"),
            "device",
            &mut by,
        )
        .unwrap();
        assert!(!base.contains_key("sink"));
    }

    #[test]
    fn unnamed_entries_and_locked_sections_are_refused_by_name() {
        let mut base = Table::new();
        let mut by = BTreeMap::new();
        let e = merge(&mut base, &t("[[scrape]]\nurl = \"x\"\n"), "all", &mut by).unwrap_err();
        assert!(e.contains("[[scrape]]") && e.contains("name"), "{e}");
        let e = merge(&mut base, &t("alert = 3\n"), "all", &mut by).unwrap_err();
        assert!(e.contains("array"), "{e}");
        let frag = t("[storage]\ndata_dir = \"/tmp/x\"\n");
        let e = check_locked(&frag, &[]).unwrap_err();
        assert!(e.contains("[storage]") && e.contains("allow"), "{e}");
        check_locked(&frag, &["storage".into()]).unwrap();
        check_locked(&t("[host]\nenabled = false\n"), &[]).unwrap();
    }
}
