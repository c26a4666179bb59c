//! Signed test JWTs for Envoy's jwt_authn filter, with no JWT library: base64url and
//! HS256 (HMAC-SHA256) written out.

use sha2::{Digest, Sha256};

/// Base64url without padding, as JWTs and JWKs use it.
pub fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// The JWKS that verifies tokens of [`hs256`] signed with `secret` (at most 64 bytes).
pub fn hs256_jwks(secret: &[u8]) -> String {
    format!(
        r#"{{"keys":[{{"kty":"oct","alg":"HS256","k":"{}"}}]}}"#,
        b64url(secret)
    )
}

/// An HS256 JWT of `payload` (JSON text) signed with `secret` (at most 64 bytes).
pub fn hs256(secret: &[u8], payload: &str) -> String {
    let signing_input = format!(
        "{}.{}",
        b64url(br#"{"alg":"HS256","typ":"JWT"}"#),
        b64url(payload.as_bytes())
    );
    let mut key = [0u8; 64];
    key[..secret.len()].copy_from_slice(secret);
    let pad = |byte: u8| key.iter().map(|k| k ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(signing_input.as_bytes())
        .finalize();
    let mac = Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize();
    format!("{signing_input}.{}", b64url(&mac))
}

/// Envoy's jwt_authn filter (a YAML list item) with one provider `provider` of issuer
/// `weir-test`, verifying [`hs256`] tokens signed with `secret` and putting their claims in
/// dynamic metadata (`jwt_payload`), plus `provider_extra` (YAML lines at the provider's
/// indentation, e.g. `claim_to_headers`); a token is required on every path, or, with
/// `optional`, checked when present.
pub fn jwt_authn_filter(
    secret: &[u8],
    provider: &str,
    provider_extra: &str,
    optional: bool,
) -> String {
    let jwks = hs256_jwks(secret);
    let requires = if optional {
        format!("{{ requires_any: {{ requirements: [ {{ provider_name: {provider} }}, {{ allow_missing: {{}} }} ] }} }}")
    } else {
        format!("{{ provider_name: {provider} }}")
    };
    format!(
        r#"- name: envoy.filters.http.jwt_authn
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
    providers:
      {provider}:
        issuer: weir-test
        local_jwks: {{ inline_string: '{jwks}' }}
        payload_in_metadata: jwt_payload
{provider_extra}    rules:
    - match: {{ prefix: "/" }}
      requires: {requires}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_without_padding() {
        assert_eq!(b64url(b""), "");
        assert_eq!(b64url(b"f"), "Zg");
        assert_eq!(b64url(b"fo"), "Zm8");
        assert_eq!(b64url(b"foo"), "Zm9v");
        assert_eq!(b64url(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn hs256_matches_the_jwt_io_example() {
        // jwt.io's HS256 example: secret "your-256-bit-secret".
        let token = hs256(
            b"your-256-bit-secret",
            r#"{"sub":"1234567890","name":"John Doe","iat":1516239022}"#,
        );
        assert_eq!(
            token.rsplit('.').next(),
            Some("SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
        );
    }
}
