//! Order-preserving encoding of index values.
//!
//! Each value encodes to a self-delimiting byte string whose plain byte order
//! equals the value order, so a tuple of values is encoded by concatenation
//! and every backend sorts index rows correctly with `memcmp`:
//!
//! `false < true < numbers < strings < missing = null`
//!
//! - numbers: integers and floats compare by value (`1 == 1.0`); an `f64` in
//!   sign-flipped big-endian form, then the exact distance of an integer
//!   from that `f64`, so integers beyond 2^53 still order exactly;
//! - strings: UTF-8 bytes (code point order), `0x00` escaped as `0x00 0xFF`,
//!   ended by `0x00 0x01`. (FoundationDB's tuple layer ends strings with a
//!   bare `0x00`, which makes `""` a prefix of `"\0"`: fine ascending, wrong
//!   once inverted for descending order.)
//! - missing: a value that is absent, `null`, or an array or object (not
//!   orderable), sorts after every value — `null` is no value, as SQL's
//!   NULL, so it sorts (and is found by `where`) with the absent ones, as
//!   api.md's "items without the sort field" do.
//!
//! Descending fields are the same bytes inverted: inversion reverses the
//! order of prefix-free strings, and every encoding here is prefix-free.

use serde_json::Value;

const FALSE: u8 = 0x02;
const TRUE: u8 = 0x03;
const NUMBER: u8 = 0x04;
const STRING: u8 = 0x05;
const MISSING: u8 = 0x06;
const HASHED: u8 = 0x07;

/// Bytes of a string value that take part in sorting.
pub const MAX_SORT_BYTES: usize = 256;

/// The longest prefix of `s` of at most `max` bytes that ends on a character
/// boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The order of one sort field.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Ascending.
    #[default]
    Asc,
    /// Descending.
    Desc,
}

impl Order {
    /// Whether this is ascending.
    pub fn is_asc(&self) -> bool {
        *self == Order::Asc
    }

    /// The other order.
    pub fn reversed(self) -> Order {
        match self {
            Order::Asc => Order::Desc,
            Order::Desc => Order::Asc,
        }
    }
}

/// Where a long string's sort key is cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cut {
    /// At the last character boundary at or before byte 256: indexes
    /// declared before 2026-12-03 (their rows were written so). A
    /// character that straddles byte 256 goes, and the string sorts as a
    /// shorter one, before strings it is greater than.
    #[default]
    Character,
    /// At byte 256, even inside a character: byte order.
    Byte,
}

impl Cut {
    /// Whether this is the older cut.
    pub fn is_character(&self) -> bool {
        *self == Cut::Character
    }
}

/// Appends the encoding of `value` (`None` = missing) in `order` to `out`.
pub fn encode_value(out: &mut Vec<u8>, value: Option<&Value>, order: Order) {
    encode_value_cut(out, value, order, Cut::Byte)
}

/// [`encode_value`], a long string cut as `cut` says.
pub fn encode_value_cut(out: &mut Vec<u8>, value: Option<&Value>, order: Order, cut: Cut) {
    let start = out.len();
    match value {
        Some(Value::Bool(false)) => out.push(FALSE),
        Some(Value::Bool(true)) => out.push(TRUE),
        Some(Value::Number(n)) => encode_number(out, n),
        Some(Value::String(s)) => {
            out.push(STRING);
            let kept = match cut {
                Cut::Character => prefix(s, MAX_SORT_BYTES).as_bytes(),
                Cut::Byte => &s.as_bytes()[..s.len().min(MAX_SORT_BYTES)],
            };
            encode_str_body(out, kept);
        }
        Some(Value::Null | Value::Array(_) | Value::Object(_)) | None => out.push(MISSING),
    }
    if order == Order::Desc {
        for b in &mut out[start..] {
            *b = !*b;
        }
    }
}

/// Appends a where-value: equal values encode equally and different ones
/// differently, whatever their length (a long string is encoded by its
/// SHA-256). Order does not matter: where-values are in partition keys.
pub fn encode_where(out: &mut Vec<u8>, value: Option<&Value>) {
    match value {
        Some(Value::String(s)) if s.len() > MAX_SORT_BYTES => {
            out.push(HASHED);
            use sha2::Digest;
            out.extend_from_slice(&sha2::Sha256::digest(s.as_bytes()));
        }
        v => encode_value(out, v, Order::Asc),
    }
}

/// [`encode_where`] into a new vector: the bytes that name a partition.
pub fn encoded_where(value: Option<&Value>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_where(&mut out, value);
    out
}

/// Appends a string in ascending order (used for names and ids in keys).
pub fn encode_str(out: &mut Vec<u8>, s: &str) {
    out.push(STRING);
    encode_str_body(out, s.as_bytes());
}

/// Decodes a string written by [`encode_str`] at the start of `bytes`:
/// the string and how many bytes it took; `None` if malformed.
pub fn decode_str(bytes: &[u8]) -> Option<(String, usize)> {
    if bytes.first() != Some(&STRING) {
        return None;
    }
    let mut out = Vec::new();
    let mut i = 1;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (0, Some(0xFF)) => {
                out.push(0);
                i += 2;
            }
            (0, Some(0x01)) => return String::from_utf8(out).ok().map(|s| (s, i + 2)),
            (0, _) => return None,
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

/// The encoding of strings starting with `prefix`: every [`encode_str`] of
/// such a string starts with these bytes.
pub fn encoded_prefix(prefix: &str) -> Vec<u8> {
    let mut out = vec![STRING];
    for &b in prefix.as_bytes() {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out
}

/// The smallest byte string greater than every string that starts with
/// `prefix`, if there is one.
pub fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut s = prefix.to_vec();
    while let Some(last) = s.pop() {
        if last < 0xFF {
            s.push(last + 1);
            return Some(s);
        }
    }
    None
}

fn encode_str_body(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0x00, 0x01]);
}

fn encode_number(out: &mut Vec<u8>, n: &serde_json::Number) {
    out.push(NUMBER);
    // The nearest f64, then the exact integer remainder (0 for floats).
    let (f, rest): (f64, i64) = if let Some(i) = n.as_i64() {
        let f = i as f64;
        (f, (i as i128 - f as i128) as i64)
    } else if let Some(u) = n.as_u64() {
        let f = u as f64;
        (f, (u as i128 - f as i128) as i64)
    } else {
        (n.as_f64().unwrap_or(0.0), 0)
    };
    // -0.0 and 0.0 are one value.
    let f = if f == 0.0 { 0.0 } else { f };
    let bits = f.to_bits();
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits ^ (1 << 63)
    };
    out.extend_from_slice(&ordered.to_be_bytes());
    out.extend_from_slice(&((rest as u64) ^ (1 << 63)).to_be_bytes());
}

/// A value's encoding in ascending order, alone.
pub fn encoded(value: Option<&Value>, order: Order) -> Vec<u8> {
    let mut out = Vec::new();
    encode_value(&mut out, value, order);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::cmp::Ordering;

    /// The reference order the encoding must agree with.
    fn compare(a: Option<&Value>, b: Option<&Value>) -> Ordering {
        fn rank(v: Option<&Value>) -> u8 {
            match v {
                Some(Value::Bool(false)) => 1,
                Some(Value::Bool(true)) => 2,
                Some(Value::Number(_)) => 3,
                Some(Value::String(_)) => 4,
                _ => 5,
            }
        }
        match (a, b) {
            (Some(Value::Number(x)), Some(Value::Number(y))) => num_cmp(x, y),
            (Some(Value::String(x)), Some(Value::String(y))) => x.as_bytes().cmp(y.as_bytes()),
            _ => rank(a).cmp(&rank(b)),
        }
    }

    fn num_cmp(x: &serde_json::Number, y: &serde_json::Number) -> Ordering {
        // Exact comparison: integers as i128, floats against floats; mixed
        // pairs in these tests stay within f64's exact integer range.
        let as_i = |n: &serde_json::Number| {
            n.as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
        };
        match (as_i(x), as_i(y)) {
            (Some(a), Some(b)) => a.cmp(&b),
            _ => x
                .as_f64()
                .unwrap()
                .partial_cmp(&y.as_f64().unwrap())
                .unwrap(),
        }
    }

    fn value() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            any::<bool>().prop_map(|b| Some(json!(b))),
            any::<i64>().prop_map(|i| Some(json!(i))),
            any::<u64>().prop_map(|u| Some(json!(u))),
            (-1e6f64..1e6).prop_map(|f| Some(json!(f))),
            (-1000i64..1000).prop_map(|i| Some(json!(i))),
            "[a-c\u{0}\u{7f}é]{0,4}".prop_map(|s| Some(json!(s))),
            Just(Some(json!([1, 2]))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn byte_order_is_value_order(a in value(), b in value()) {
            let want = compare(a.as_ref(), b.as_ref());
            let asc = encoded(a.as_ref(), Order::Asc).cmp(&encoded(b.as_ref(), Order::Asc));
            prop_assert_eq!(asc, want);
            let desc = encoded(a.as_ref(), Order::Desc).cmp(&encoded(b.as_ref(), Order::Desc));
            prop_assert_eq!(desc, want.reverse());
        }

        #[test]
        fn tuples_order_field_by_field(a in value(), b in value(), c in value(), d in value(),
                                       oa in prop_oneof![Just(Order::Asc), Just(Order::Desc)]) {
            // Concatenated encodings order like the tuples they encode.
            let mut x = encoded(a.as_ref(), oa);
            encode_value(&mut x, c.as_ref(), Order::Asc);
            let mut y = encoded(b.as_ref(), oa);
            encode_value(&mut y, d.as_ref(), Order::Asc);
            let first = compare(a.as_ref(), b.as_ref());
            let first = if oa == Order::Desc { first.reverse() } else { first };
            let want = first.then(compare(c.as_ref(), d.as_ref()));
            prop_assert_eq!(x.cmp(&y), want);
        }
    }

    #[test]
    fn integers_and_floats_are_one_number_line() {
        let e = |v: Value| encoded(Some(&v), Order::Asc);
        assert_eq!(e(json!(1)), e(json!(1.0)));
        assert_eq!(e(json!(0.0)), e(json!(-0.0)));
        assert!(e(json!(1)) < e(json!(1.5)));
        assert!(e(json!(-2)) < e(json!(-1.5)));
        assert!(e(json!(u64::MAX - 1)) < e(json!(u64::MAX)));
        assert!(e(json!(9_007_199_254_740_993u64)) > e(json!(9_007_199_254_740_992u64)));
        assert!(e(json!(i64::MIN)) < e(json!(i64::MIN + 1)));
    }

    #[test]
    fn long_sort_strings_are_cut_long_where_values_stay_exact() {
        let long_a = "é".repeat(200) + "a";
        let long_b = "é".repeat(200) + "b";
        let e = |s: &str| encoded(Some(&json!(s)), Order::Asc);
        assert!(
            e(&long_a).len() < MAX_SORT_BYTES + 8,
            "a sort key is bounded"
        );
        assert_eq!(e(&long_a), e(&long_b), "past the prefix, values tie");
        assert!(e("a") < e(&long_a));
        let w = |s: &str| {
            let mut out = Vec::new();
            encode_where(&mut out, Some(&json!(s)));
            out
        };
        assert_ne!(w(&long_a), w(&long_b), "where-values stay exact");
        assert_eq!(w(&long_a), w(&long_a.clone()));
        assert_eq!(w("short"), e("short"));
        assert_eq!(prefix("aé", 2), "a", "cut at a character boundary");
    }

    #[test]
    fn strings_cut_inside_a_character_keep_byte_order() {
        let e = |s: String| encoded(Some(&json!(s)), Order::Asc);
        let x = |n: usize, tail: &str| format!("{}{tail}", "x".repeat(n));
        // Byte (and code point) order; each character straddles byte 256
        // or ends at it.
        let sorted = [x(255, "y"), x(255, "é"), x(254, "z"), x(254, "😀")];
        for pair in sorted.windows(2) {
            assert!(e(pair[0].clone()) < e(pair[1].clone()), "{pair:?}");
        }
        let d = |s: &String| encoded(Some(&json!(s)), Order::Desc);
        assert!(d(&sorted[1]) < d(&sorted[0]), "and reversed, descending");
        // Indexes declared before keep the cut their rows were written with.
        let old = |s: &String| {
            let mut out = Vec::new();
            encode_value_cut(&mut out, Some(&json!(s)), Order::Asc, Cut::Character);
            out
        };
        assert!(old(&sorted[1]) < old(&sorted[0]), "the older cut");
        assert_eq!(
            old(&sorted[0]),
            e(sorted[0].clone()),
            "alike where no character straddles"
        );
    }

    #[test]
    fn strings_decode_and_prefixes_bound() {
        for s in ["", "a", "a\0b", "é\0\0", "zz"] {
            let mut e = Vec::new();
            encode_str(&mut e, s);
            e.extend_from_slice(b"rest");
            assert_eq!(decode_str(&e), Some((s.to_string(), e.len() - 4)));
            assert!(e.starts_with(&encoded_prefix(s)));
        }
        let mut e = Vec::new();
        encode_str(&mut e, "brewing");
        let p = encoded_prefix("brew");
        assert!(e.starts_with(&p));
        assert!(e < successor(&p).unwrap());
        let mut other = Vec::new();
        encode_str(&mut other, "brex");
        assert!(other >= successor(&p).unwrap());
        assert_eq!(successor(&[0x01, 0xFF]), Some(vec![0x02]));
        assert_eq!(successor(&[0xFF]), None);
        assert_eq!(decode_str(b"\x05ab"), None);
    }

    #[test]
    fn strings_with_nul_and_prefixes() {
        let e = |s: &str| encoded(Some(&json!(s)), Order::Asc);
        assert!(e("") < e("\0"));
        assert!(e("a") < e("a\0"));
        assert!(e("a\0") < e("a\u{1}"));
        assert!(e("ab") < e("b"));
        assert!(e("Z") < e("a"), "byte order: upper case first");
    }
}
