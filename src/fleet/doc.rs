//! Signed fleet documents and their keys: ed25519 (through `ring`) key pairs, the plain-text
//! document a person can read (a two-line header, the TOML fragment as written, a signature
//! line), signing, and verification against `[fleet] public_key`. The signature covers the
//! header's version and the body byte for byte, so neither can be changed or replayed under
//! another version. Pure: no IO, no clock, no knowledge of layers or transports.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

/// The first line of every document.
pub const MAGIC: &str = "# edgewatch-fleet-config v1";
const VERSION_PREFIX: &str = "# version = ";
const SIGNATURE_PREFIX: &str = "# signature = ";

/// Why a document or a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocError {
    /// The document is larger than `[fleet] max_document_bytes`.
    #[error("document is {size} bytes, over the {max}-byte cap ([fleet] max_document_bytes)")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The cap.
        max: usize,
    },
    /// Not in the document form (header, body, signature line).
    #[error("not a signed fleet document: {0}")]
    Form(String),
    /// The signature does not verify with the configured public key.
    #[error(
        "bad signature: not signed by the key in [fleet] public_key (or changed after signing)"
    )]
    Signature,
    /// A key file or key text does not parse.
    #[error("invalid key: {0}")]
    Key(String),
}

/// A parsed, not yet verified document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// The version the header states (covered by the signature).
    pub version: u64,
    /// The TOML fragment exactly as signed.
    pub body: String,
    /// The ed25519 signature (64 bytes).
    pub signature: Vec<u8>,
}

/// The bytes a signature covers: the magic line, the version line, then the body.
fn signed_bytes(version: u64, body: &str) -> Vec<u8> {
    format!("{MAGIC}\n{VERSION_PREFIX}{version}\n{body}").into_bytes()
}

/// A new key pair: (private key text, public key text). The private key is the PKCS#8
/// document in base64 on one line; the public key the raw 32 bytes in base64 on one line.
pub fn generate() -> Result<(String, String), DocError> {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
        .map_err(|_| DocError::Key("the system random source failed".into()))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
        .map_err(|e| DocError::Key(format!("generated key does not load: {e}")))?;
    Ok((
        B64.encode(pkcs8.as_ref()),
        B64.encode(pair.public_key().as_ref()),
    ))
}

/// Loads a private key written by [`generate`].
pub fn private_key(text: &str) -> Result<Ed25519KeyPair, DocError> {
    let der = B64
        .decode(text.trim())
        .map_err(|e| DocError::Key(format!("private key is not base64: {e}")))?;
    Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
        .map_err(|e| DocError::Key(format!("not an ed25519 PKCS#8 private key: {e}")))
}

/// Decodes a public key as `[fleet] public_key` holds it (32 bytes, base64).
pub fn public_key(text: &str) -> Result<Vec<u8>, DocError> {
    let raw = B64
        .decode(text.trim())
        .map_err(|e| DocError::Key(format!("public_key is not base64: {e}")))?;
    if raw.len() != 32 {
        return Err(DocError::Key(format!(
            "public_key is {} bytes, an ed25519 public key is 32 (the one line of fleet.pub)",
            raw.len()
        )));
    }
    Ok(raw)
}

/// Signs `body` (a TOML fragment; a final newline is added if missing) as `version`.
pub fn sign(key: &Ed25519KeyPair, version: u64, body: &str) -> String {
    let mut body = body.to_string();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    let sig = key.sign(&signed_bytes(version, &body));
    format!(
        "{MAGIC}\n{VERSION_PREFIX}{version}\n{body}{SIGNATURE_PREFIX}{}\n",
        B64.encode(sig.as_ref())
    )
}

/// Parses a document (at most `max` bytes); the signature is not checked here.
pub fn parse(text: &[u8], max: usize) -> Result<Document, DocError> {
    if text.len() > max {
        return Err(DocError::TooLarge {
            size: text.len(),
            max,
        });
    }
    let text = std::str::from_utf8(text).map_err(|_| DocError::Form("not UTF-8".into()))?;
    let rest = text
        .strip_prefix(MAGIC)
        .and_then(|r| r.strip_prefix('\n'))
        .ok_or_else(|| DocError::Form(format!("the first line must be `{MAGIC}`")))?;
    let (vline, rest) = rest
        .split_once('\n')
        .ok_or_else(|| DocError::Form("no version line".into()))?;
    let version = vline
        .strip_prefix(VERSION_PREFIX)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| {
            DocError::Form(format!(
                "the second line must be `{VERSION_PREFIX}N` (N a whole number), found {vline:?}"
            ))
        })?;
    let trimmed = rest.trim_end_matches('\n');
    let (body, sline) = match trimmed.rfind('\n') {
        Some(i) => (&trimmed[..=i], &trimmed[i + 1..]),
        None => ("", trimmed),
    };
    let sig = sline
        .strip_prefix(SIGNATURE_PREFIX)
        .ok_or_else(|| DocError::Form(format!("the last line must be `{SIGNATURE_PREFIX}...`")))?;
    let signature = B64
        .decode(sig.trim())
        .map_err(|e| DocError::Form(format!("the signature is not base64: {e}")))?;
    Ok(Document {
        version,
        body: body.to_string(),
        signature,
    })
}

impl Document {
    /// Checks the signature against the raw 32-byte public key.
    pub fn verify(&self, public_key: &[u8]) -> Result<(), DocError> {
        UnparsedPublicKey::new(&ED25519, public_key)
            .verify(&signed_bytes(self.version, &self.body), &self.signature)
            .map_err(|_| DocError::Signature)
    }
}

pub use crate::config::digest::sha256_hex;

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> (Ed25519KeyPair, Vec<u8>) {
        let (private, public) = generate().unwrap();
        (private_key(&private).unwrap(), public_key(&public).unwrap())
    }

    #[test]
    fn a_signed_document_reads_back_and_verifies() {
        let (k, p) = keys();
        let text = sign(&k, 7, "[alerts]\nevaluate_every = \"5s\"");
        assert!(text.starts_with(MAGIC), "{text}");
        assert!(text.contains("# version = 7\n[alerts]\n"), "{text}");
        let d = parse(text.as_bytes(), 65536).unwrap();
        assert_eq!(d.version, 7);
        assert_eq!(d.body, "[alerts]\nevaluate_every = \"5s\"\n");
        d.verify(&p).unwrap();
        // The whole document is TOML too (header and signature are comments).
        assert!(toml::from_str::<toml::Table>(&text).is_ok());
        // An empty fragment is a document too.
        let e = parse(sign(&k, 1, "").as_bytes(), 65536).unwrap();
        assert_eq!(e.body, "\n");
        e.verify(&p).unwrap();
    }

    #[test]
    fn a_changed_version_or_body_or_another_key_fails() {
        let (k, p) = keys();
        let text = sign(&k, 3, "[host]\ninterval = \"5s\"\n");
        let bumped = text.replace("# version = 3", "# version = 4");
        assert_eq!(
            parse(bumped.as_bytes(), 65536).unwrap().verify(&p),
            Err(DocError::Signature)
        );
        let edited = text.replace("5s", "1s");
        assert_eq!(
            parse(edited.as_bytes(), 65536).unwrap().verify(&p),
            Err(DocError::Signature)
        );
        let (_, other) = keys();
        assert_eq!(
            parse(text.as_bytes(), 65536).unwrap().verify(&other),
            Err(DocError::Signature)
        );
    }

    #[test]
    fn bad_forms_and_sizes_are_named() {
        let (k, _) = keys();
        let text = sign(&k, 1, "[host]\n");
        let e = parse(text.as_bytes(), 10).unwrap_err();
        assert!(matches!(e, DocError::TooLarge { max: 10, .. }), "{e}");
        assert!(e.to_string().contains("max_document_bytes"));
        let e = parse(b"[host]\nenabled = true\n", 65536).unwrap_err();
        assert!(e.to_string().contains("first line"), "{e}");
        let e = parse(format!("{MAGIC}\n# version = x\n").as_bytes(), 65536).unwrap_err();
        assert!(e.to_string().contains("second line"), "{e}");
        let unsigned = text.lines().take(3).collect::<Vec<_>>().join("\n");
        let e = parse(unsigned.as_bytes(), 65536).unwrap_err();
        assert!(e.to_string().contains("last line"), "{e}");
        assert!(public_key("AAAA").unwrap_err().to_string().contains("32"));
        assert!(private_key("not base64!").is_err());
    }
}
