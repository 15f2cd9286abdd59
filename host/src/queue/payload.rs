//! Message values compared as JSON values, not bytes: the canonical hash of a payload is the
//! SHA-256 of its JSON re-written with sorted object keys (the last of duplicate keys wins),
//! no insignificant whitespace, strings with one escaping, and numbers by their exact decimal
//! value (`1`, `1.0`, `10e-1` are one number; integers beyond 64 bits keep every digit). So
//! `{"a":1, "b":2}` and `{"b":2,"a":1}` are equal. Used by idempotent queues: two payloads
//! with one hash are the same values, so discarding one never drops a change.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The canonical hash of a JSON payload (hex). Text that is not JSON hashes as raw bytes, so
/// it only equals itself.
pub fn canonical_hash(payload: &str) -> String {
    let canonical = match canonical_json(payload) {
        Some(json) => json,
        None => format!("raw:{payload}"),
    };
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// The canonical text of a JSON document, or `None` when it is not JSON.
pub fn canonical_json(text: &str) -> Option<String> {
    // serde_json decides what is JSON (and bounds the nesting); the walk below only rewrites.
    serde_json::from_str::<serde::de::IgnoredAny>(text).ok()?;
    let mut walk = Walk { text, at: 0 };
    let mut out = String::with_capacity(text.len());
    walk.value(&mut out)?;
    Some(out)
}

/// A rewrite of already validated JSON text.
struct Walk<'a> {
    text: &'a str,
    at: usize,
}

impl Walk<'_> {
    fn skip_space(&mut self) {
        let bytes = self.text.as_bytes();
        while self.at < bytes.len() && matches!(bytes[self.at], b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.text.as_bytes().get(self.at).copied()
    }

    fn value(&mut self, out: &mut String) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(out),
            b'[' => self.array(out),
            b'"' => {
                let decoded = self.string()?;
                out.push_str(&serde_json::to_string(&decoded).ok()?);
                Some(())
            }
            b't' | b'f' | b'n' => {
                let word = ["true", "false", "null"]
                    .into_iter()
                    .find(|w| self.text[self.at..].starts_with(w))?;
                out.push_str(word);
                self.at += word.len();
                Some(())
            }
            _ => self.number(out),
        }
    }

    fn object(&mut self, out: &mut String) -> Option<()> {
        self.at += 1; // '{'
        let mut members: BTreeMap<String, String> = BTreeMap::new();
        if self.peek()? == b'}' {
            self.at += 1;
        } else {
            loop {
                self.peek()?;
                let key = self.string()?;
                self.peek()?;
                self.at += 1; // ':'
                let mut value = String::new();
                self.value(&mut value)?;
                members.insert(key, value);
                match self.peek()? {
                    b',' => self.at += 1,
                    _ => {
                        self.at += 1; // '}'
                        break;
                    }
                }
            }
        }
        out.push('{');
        for (n, (key, value)) in members.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(key).ok()?);
            out.push(':');
            out.push_str(value);
        }
        out.push('}');
        Some(())
    }

    fn array(&mut self, out: &mut String) -> Option<()> {
        self.at += 1; // '['
        out.push('[');
        if self.peek()? == b']' {
            self.at += 1;
        } else {
            loop {
                self.value(out)?;
                match self.peek()? {
                    b',' => {
                        self.at += 1;
                        out.push(',');
                    }
                    _ => {
                        self.at += 1; // ']'
                        break;
                    }
                }
            }
        }
        out.push(']');
        Some(())
    }

    /// A string token, decoded.
    fn string(&mut self) -> Option<String> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut end = start + 1;
        let mut escaped = false;
        while end < bytes.len() {
            match bytes[end] {
                b'\\' => {
                    escaped = true;
                    end += 2; // past the escaped character (or the `u` of `\uXXXX`)
                }
                b'"' => break,
                _ => end += 1,
            }
        }
        self.at = end + 1;
        let token = &self.text[start..=end];
        if escaped {
            serde_json::from_str(token).ok()
        } else {
            Some(token[1..token.len() - 1].to_string())
        }
    }

    /// A number token, written by its exact decimal value: `[-]DIGITS` or `[-]DIGITSeEXP`
    /// with no leading or trailing zeros in DIGITS (zero is `0`).
    fn number(&mut self, out: &mut String) -> Option<()> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut end = start;
        while end < bytes.len()
            && matches!(bytes[end], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
        {
            end += 1;
        }
        self.at = end;
        let token = &self.text[start..end];
        out.push_str(&exact_number(token).unwrap_or_else(|| format!("n:{token}")));
        Some(())
    }
}

/// The canonical form of a JSON number token; `None` when its exponent is too large to
/// normalise exactly (then the token stands for itself).
fn exact_number(token: &str) -> Option<String> {
    let (negative, unsigned) = match token.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, token),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let exponent: i128 = exponent
        .strip_prefix('+')
        .unwrap_or(exponent)
        .parse()
        .ok()?;
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Some("0".to_string());
    }
    let exponent = exponent - frac.len() as i128 + (digits.len() - significant.len()) as i128;
    let sign = if negative { "-" } else { "" };
    Some(if exponent == 0 {
        format!("{sign}{significant}")
    } else {
        format!("{sign}{significant}e{exponent}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_hash_equal() {
        assert_eq!(
            canonical_hash(r#"{"a":1,"b":[1,2]}"#),
            canonical_hash("{ \"b\": [1, 2],\n \"a\": 1 }")
        );
        assert_eq!(
            canonical_hash(r#"{"s":"\u0041"}"#),
            canonical_hash(r#"{"s":"A"}"#)
        );
        assert_eq!(canonical_hash("[1, 1.0, 10e-1]"), canonical_hash("[1,1,1]"));
        assert_eq!(canonical_hash("[-0, 0.0, 0e5]"), canonical_hash("[0,0,0]"));
    }

    #[test]
    fn different_values_hash_different() {
        assert_ne!(canonical_hash(r#"{"a":1}"#), canonical_hash(r#"{"a":2}"#));
        assert_ne!(canonical_hash(r#"{"a":1}"#), canonical_hash(r#"{"a":"1"}"#));
        assert_ne!(canonical_hash(r#"[1,2]"#), canonical_hash(r#"[2,1]"#));
        // Beyond 64 bits (and beyond a double's precision) every digit still counts.
        assert_ne!(
            canonical_hash("18446744073709551616"),
            canonical_hash("18446744073709551617")
        );
        assert_ne!(canonical_hash("0.1"), canonical_hash("0.10000000000000001"));
    }

    #[test]
    fn canonical_text() {
        assert_eq!(
            canonical_json(r#" {"b": [true, null, "x\"y"], "a": -12.50e2, "a": 3} "#).unwrap(),
            r#"{"a":3,"b":[true,null,"x\"y"]}"#
        );
        assert_eq!(canonical_json("-12.50e2").unwrap(), "-125e1");
        assert_eq!(canonical_json("1200").unwrap(), "12e2");
        assert_eq!(canonical_json("not json"), None);
    }
}
