//! Keys: where a key part's bytes came from, how a key is hashed to its slot in this
//! Envoy, and how it is named to the bridge and in Redis.
//!
//! A rule's key is an ordered list of parts, each with its [`PartOrigin`]. Parts are
//! framed unambiguously everywhere — hashed with their origin and length
//! ([`KeyHasher`]), sent with an origin prefix ([`encode_part`]), hashed again, framed,
//! into the Redis hash tag ([`redis_key_tag`]) — so `["a:b", "c"]` and `["a", "b:c"]`
//! are different keys, and a configured default can never be forged by sending its text.
//!
//! Nothing a client sends ever becomes part of a shared-data key or a Redis key: both are
//! built from hashes.

use crate::algorithms::AlgorithmKind;
use crate::bounds::MAX_PLAIN_PART_BYTES;
use sha2::{Digest, Sha256};
use siphasher::sip128::{Hasher128, SipHasher13};
use std::fmt::Write as _;
use std::hash::Hasher;

/// Where a key part's bytes came from: hashed and sent with the bytes, so that a default
/// can never equal a value a client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartOrigin {
    Request,
    Default,
    Static,
}

/// The secret that keys the slot hash; one per Envoy process, shared by all workers
/// through shared data (see `weir_core::store::slot_table`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Seed(pub [u8; 16]);

impl std::fmt::Debug for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seed(..)")
    }
}

/// Where a key lives in its table: the set and the fingerprint (never 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash {
    pub set_hash: u64,
    pub fingerprint: u64,
}

/// Hashes the parts of one key under the seed: SipHash-1-3, 128 bits.
pub struct KeyHasher(SipHasher13);

impl KeyHasher {
    pub fn new(seed: &Seed) -> Self {
        KeyHasher(SipHasher13::new_with_key(&seed.0))
    }

    pub fn part(&mut self, origin: PartOrigin, bytes: &[u8]) {
        let tag: u8 = match origin {
            PartOrigin::Request => 1,
            PartOrigin::Default => 2,
            PartOrigin::Static => 3,
        };
        self.0.write_u8(tag);
        self.0.write_u64(bytes.len() as u64);
        self.0.write(bytes);
    }

    pub fn finish(&self) -> KeyHash {
        let (set_hash, fingerprint) = self.0.finish128().as_u64();
        KeyHash {
            set_hash,
            fingerprint: fingerprint.max(1),
        }
    }
}

/// Encodes one key part for the bridge, as a string with a one-character origin prefix,
/// so that no value can pass for another kind: `=` a request value (UTF-8 that needs no
/// escaping in JSON, at most [`MAX_PLAIN_PART_BYTES`] bytes), `!` the SHA-256 (hex) of
/// any other request value, `~` a configured default, `#` a configured static value
/// (the config refuses control characters in those, so they at most double in JSON).
pub fn encode_part(origin: PartOrigin, bytes: &[u8]) -> String {
    match origin {
        PartOrigin::Default => format!("~{}", String::from_utf8_lossy(bytes)),
        PartOrigin::Static => format!("#{}", String::from_utf8_lossy(bytes)),
        PartOrigin::Request => match std::str::from_utf8(bytes) {
            Ok(text) if bytes.len() <= MAX_PLAIN_PART_BYTES && is_plain(text) => {
                format!("={text}")
            }
            _ => format!("!{}", hex(&Sha256::digest(bytes))),
        },
    }
}

/// Text that JSON carries as it is: no control characters, quotes or backslashes.
fn is_plain(text: &str) -> bool {
    !text
        .chars()
        .any(|c| c.is_control() || c == '"' || c == '\\')
}

/// `bytes` as lowercase hex: Redis key tags here, and weir-core's hashed logs.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The hash tag of a descriptor's Redis keys: 32 hex digits of
/// SHA-256(domain, rule, algorithm, parts), each framed by its length. Nothing a client
/// sends appears in a key, and every key of one descriptor lands in one hash slot.
pub fn redis_key_tag(
    domain: &str,
    rule: &str,
    algorithm: AlgorithmKind,
    descriptor: &[String],
) -> String {
    let mut hasher = Sha256::new();
    let mut frame = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    frame(domain.as_bytes());
    frame(rule.as_bytes());
    frame(algorithm.name().as_bytes());
    for part in descriptor {
        frame(part.as_bytes());
    }
    let digest = hasher.finalize();
    hex(digest.get(..16).unwrap_or(&[]))
}

/// A key within a shared limit's parent, as Redis names it among the parent's keys:
/// its descriptor parts (`share.by`) framed and hashed (SHA-256, 64 bits, never 0).
pub fn redis_share_key_id(parts: &[String]) -> u64 {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let first: [u8; 8] = digest
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .unwrap_or([0; 8]);
    u64::from_le_bytes(first).max(1)
}

/// The state key of a shared limit's parent: `weir:{<tag>}:<algorithm>:share`, beside
/// (never instead of) the plain state key of the same descriptor.
pub fn redis_share_key(tag: &str, algorithm: AlgorithmKind) -> String {
    format!("{}:share", redis_state_key(tag, algorithm))
}

/// The state key of a descriptor: `weir:{<tag>}:<algorithm>`.
pub fn redis_state_key(tag: &str, algorithm: AlgorithmKind) -> String {
    format!("weir:{{{tag}}}:{algorithm}")
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn framing_keeps_parts_apart() {
        let seed = Seed([9; 16]);
        let hash = |parts: &[&[u8]]| {
            let mut h = KeyHasher::new(&seed);
            for p in parts {
                h.part(PartOrigin::Request, p);
            }
            h.finish()
        };
        assert_ne!(hash(&[b"a:b", b"c"]), hash(&[b"a", b"b:c"]));
        assert_ne!(hash(&[b"ab"]), hash(&[b"a", b"b"]));
        assert_ne!(hash(&[b""]), hash(&[]));
        let mut d = KeyHasher::new(&seed);
        d.part(PartOrigin::Default, b"anonymous");
        assert_ne!(d.finish(), hash(&[b"anonymous"]));
    }

    #[test]
    fn seeds_change_every_hash() {
        let hash = |seed: [u8; 16]| {
            let mut h = KeyHasher::new(&Seed(seed));
            h.part(PartOrigin::Request, b"alice");
            h.finish()
        };
        let (a, b) = (hash([1; 16]), hash([2; 16]));
        assert_ne!(a.set_hash, b.set_hash);
        assert_ne!(a.fingerprint, b.fingerprint);
    }

    #[test]
    fn key_format_is_pinned() {
        let tag = redis_key_tag(
            "weir",
            "per-tenant",
            AlgorithmKind::Gcra,
            &["=acme".to_string()],
        );
        assert_eq!(tag.len(), 32);
        assert_eq!(
            redis_state_key(&tag, AlgorithmKind::Gcra),
            format!("weir:{{{tag}}}:gcra")
        );
        let spliced = |parts: &[&str]| {
            let parts: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
            redis_key_tag("weir", "r", AlgorithmKind::Gcra, &parts)
        };
        assert_ne!(spliced(&["=a:b", "=c"]), spliced(&["=a", "=b:c"]));
        assert_ne!(spliced(&["=ab"]), spliced(&["=a", "=b"]));
        // A golden value (also computed with Python's hashlib): changing the derivation
        // strands every key in Redis.
        assert_eq!(spliced(&["=alice"]), "97faf72bcf3817fffd093677ded2178f");
    }

    #[test]
    fn parts_say_where_they_come_from() {
        assert_eq!(encode_part(PartOrigin::Request, b"alice"), "=alice");
        assert_eq!(encode_part(PartOrigin::Default, b"anonymous"), "~anonymous");
        assert_eq!(encode_part(PartOrigin::Static, b"v1"), "#v1");
        let hashed = |bytes: &[u8]| {
            let part = encode_part(PartOrigin::Request, bytes);
            part.starts_with('!') && part.len() == 65
        };
        assert!(hashed(b"\xff\xfe"), "not UTF-8");
        assert!(hashed("x".repeat(200).as_bytes()), "long");
        assert!(hashed(b"a\"b"), "needs escaping");
        assert!(hashed(b"a\\b"), "needs escaping");
        assert!(hashed(b"a\tb"), "control character");
        assert_eq!(encode_part(PartOrigin::Request, "é".as_bytes()), "=é");
        assert_ne!(
            encode_part(PartOrigin::Request, b"~anonymous"),
            encode_part(PartOrigin::Default, b"anonymous")
        );
    }
}
