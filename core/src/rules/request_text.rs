//! Pieces of request text the rules read: the path without its query, a query parameter
//! percent-decoded, the host of an authority, an address without its port.

/// `/a/b?x=1` → `/a/b`.
pub fn path_only(path: &[u8]) -> &[u8] {
    match path.iter().position(|&b| b == b'?') {
        Some(at) => path.get(..at).unwrap_or(path),
        None => path,
    }
}

/// `example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
pub fn host_only(authority: &[u8]) -> &[u8] {
    if authority.first() == Some(&b'[') {
        return match authority.iter().position(|&b| b == b']') {
            Some(end) => authority.get(..=end).unwrap_or(authority),
            None => authority,
        };
    }
    match authority.iter().rposition(|&b| b == b':') {
        Some(at) => authority.get(..at).unwrap_or(authority),
        None => authority,
    }
}

/// `1.2.3.4:5678` → `1.2.3.4`; `[2001:db8::1]:443` → `2001:db8::1`; anything else as is.
pub fn strip_port(address: &[u8]) -> &[u8] {
    if address.first() == Some(&b'[') {
        if let Some(end) = address.iter().position(|&b| b == b']') {
            return address.get(1..end).unwrap_or(address);
        }
        return address;
    }
    let colons = address.iter().filter(|&&b| b == b':').count();
    if colons == 1 {
        if let Some(at) = address.iter().position(|&b| b == b':') {
            return address.get(..at).unwrap_or(address);
        }
    }
    address
}

/// The first value of query parameter `name` in `path`, percent-decoded (`+` stays `+`).
/// A parameter present without `=` has the empty value.
pub fn query_param(path: &[u8], name: &[u8]) -> Option<Vec<u8>> {
    let at = path.iter().position(|&b| b == b'?')?;
    let query = path.get(at + 1..)?;
    let query = match query.iter().position(|&b| b == b'#') {
        Some(end) => query.get(..end)?,
        None => query,
    };
    for pair in query.split(|&b| b == b'&') {
        let (raw_name, raw_value) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (pair.get(..eq)?, pair.get(eq + 1..)?),
            None => (pair, &[][..]),
        };
        if percent_decode(raw_name) == name {
            return Some(percent_decode(raw_value));
        }
    }
    None
}

fn percent_decode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while let Some(&b) = input.get(i) {
        if b == b'%' {
            let hi = input.get(i + 1).and_then(|&h| hex_value(h));
            let lo = input.get(i + 2).and_then(|&l| hex_value(l));
            if let (Some(hi), Some(lo)) = (hi, lo) {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    out
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn query_params_are_decoded_and_first_wins() {
        assert_eq!(
            query_param(b"/x?user=a%62&user=c", b"user"),
            Some(b"ab".to_vec())
        );
        assert_eq!(query_param(b"/x?a=1&flag&b=2", b"flag"), Some(Vec::new()));
        assert_eq!(query_param(b"/x?u%73er=z", b"user"), Some(b"z".to_vec()));
        assert_eq!(query_param(b"/x?a=1#user=2", b"user"), None);
        assert_eq!(query_param(b"/x", b"user"), None);
        assert_eq!(
            query_param(b"/x?user=%zz%4", b"user"),
            Some(b"%zz%4".to_vec())
        );
    }

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port(b"10.0.0.1:5555"), b"10.0.0.1");
        assert_eq!(strip_port(b"[2001:db8::1]:443"), b"2001:db8::1");
        assert_eq!(strip_port(b"2001:db8::1"), b"2001:db8::1");
        assert_eq!(host_only(b"Example.com:8080"), b"Example.com");
        assert_eq!(host_only(b"[::1]:80"), b"[::1]");
        assert_eq!(path_only(b"/a/b?c=d"), b"/a/b");
    }
}
