//! `config_sha256`: one identity of the effective configuration, the SHA-256 (lower-case
//! hex) of its canonical TOML: the typed [`Config`] serialized back (every key, defaults
//! included, in the struct's order, maps sorted), so two agents running the same effective
//! configuration report the same hash whatever their files' layout, comments or the layer a
//! value came from. Reported in the inventory (`edgewatch_agent_info`); the live-reload
//! status reports the same function's value. Pure; it never reads a file.

use super::Config;

/// The SHA-256 of `cfg`'s canonical TOML, lower-case hex (64 digits). A config that cannot
/// be serialized (it always can: it was read from TOML) hashes its `Debug` text instead.
pub fn config_sha256(cfg: &Config) -> String {
    sha256_hex(canonical(cfg).as_bytes())
}

/// The canonical text of a config: every key, sorted, as TOML (secrets as themselves, so a
/// changed password changes it). Two configs are equal exactly when their texts are.
pub fn canonical(cfg: &Config) -> String {
    toml::Table::try_from(cfg)
        .and_then(|t| toml::to_string(&t))
        .unwrap_or_else(|e| format!("<unserializable: {e}>"))
}

/// SHA-256 of `bytes`, lower-case hex: the one hash of configs and fleet documents
/// (`ring`, which rustls already links).
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_effective_config_hashes_the_same_and_any_change_differs() {
        let a = Config::from_toml_str("[health]\ninterval = \"10s\"\n", "a").unwrap();
        // The same values, written differently (a comment, the default spelled out).
        let b = Config::from_toml_str("# x\n[health]\nenabled = true\ninterval = \"10s\"\n", "b")
            .unwrap();
        let c = Config::from_toml_str("[health]\ninterval = \"11s\"\n", "c").unwrap();
        let h = config_sha256(&a);
        assert_eq!(h.len(), 64);
        assert!(h
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(h, config_sha256(&b));
        assert_ne!(h, config_sha256(&c));
        // The hash of the canonical text; the hash itself against FIPS 180-2's "abc" vector.
        assert_eq!(h, sha256_hex(canonical(&a).as_bytes()));
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
