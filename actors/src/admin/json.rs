//! Parsing a JSON body the way docs/openapi.json describes it.

/// The JSON body as `T`. JSON Schema (docs/openapi.json) counts `3.0` and `1e3` as integers
/// and serde's `i64` does not, so such literals are rewritten as the integer first
/// ([`integral_literals`]); `3.5`, or a value beyond `i64`, stays as written and is refused.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(&integral_literals(body))
}

/// `body` with every number literal outside strings that has an integral value within `i64`
/// but a fraction or an exponent (`3.0`, `1e+16`, `-12.50e1`) written as that integer. Exact:
/// from the literal's digits, never through a float.
fn integral_literals(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let (mut i, mut in_string, mut escaped) = (0, false, false);
    while i < body.len() {
        let b = body[i];
        if in_string {
            (in_string, escaped) = (escaped || b != b'"', !escaped && b == b'\\');
        } else if b == b'"' {
            in_string = true;
        } else if b == b'-' || b.is_ascii_digit() {
            let len = body[i..]
                .iter()
                .position(|c| !(c.is_ascii_digit() || b"+-.eE".contains(c)))
                .unwrap_or(body.len() - i);
            let literal = &body[i..i + len];
            match std::str::from_utf8(literal).ok().and_then(integral) {
                Some(int) => out.extend_from_slice(int.as_bytes()),
                None => out.extend_from_slice(literal),
            }
            i += len;
            continue;
        }
        out.push(b);
        i += 1;
    }
    out
}

/// The integer a JSON number literal with a fraction or an exponent stands for, when it is
/// integral and within `i64`.
fn integral(literal: &str) -> Option<String> {
    let unsigned = literal.strip_prefix('-').unwrap_or(literal);
    let (mantissa, exp) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    if (frac.is_empty() && exp == 0)
        || int.is_empty()
        || !digits.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    // The value is 0.<digits> × 10^point: integral when no non-zero digit follows `point`.
    let point = (int.len() as i64).checked_add(exp)?;
    let cut = usize::try_from(point.clamp(0, digits.len() as i64)).ok()?;
    if digits[cut..].bytes().any(|c| c != b'0') || point > 40 {
        return None;
    }
    let zeros = "0".repeat(
        usize::try_from(point)
            .unwrap_or(0)
            .saturating_sub(digits.len()),
    );
    let magnitude: i128 = format!("0{}{zeros}", &digits[..cut]).parse().ok()?;
    let value = if literal.starts_with('-') {
        -magnitude
    } else {
        magnitude
    };
    i64::try_from(value).ok().map(|v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::integral_literals;

    #[test]
    fn integral_literals_become_integers_exactly() {
        let cases = [
            (
                r#"{"a": [3.0, -2.50e1, 1e+16, 12, 1.5, "7.0"]}"#,
                r#"{"a": [3, -25, 10000000000000000, 12, 1.5, "7.0"]}"#,
            ),
            ("-9223372036854775808.0", "-9223372036854775808"),
            ("-9223372036854775809.0", "-9223372036854775809.0"),
            ("9223372036854775808e0", "9223372036854775808e0"),
            ("4287719443501732.0", "4287719443501732"),
            ("4503599627370495.5", "4503599627370495.5"),
            (
                r#"{"k\\": 2.0, "s": "a\"1.0"}"#,
                r#"{"k\\": 2, "s": "a\"1.0"}"#,
            ),
            ("1e999999999999999999", "1e999999999999999999"),
            ("0.0e-5", "0"),
        ];
        for (input, want) in cases {
            let got = String::from_utf8(integral_literals(input.as_bytes())).unwrap_or_default();
            assert_eq!(got, want, "{input}");
        }
    }
}
