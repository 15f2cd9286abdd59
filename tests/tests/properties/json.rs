//! Generated JSON values, with exact numbers (any number of digits) and several spellings of
//! one value (key order, whitespace, number notation, string escapes).

use std::collections::BTreeMap;

use proptest::prelude::*;

/// A JSON number by its exact value: `digits × 10^exponent` (no leading or trailing zeros
/// in `digits`; zero is empty digits, never negative).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Number {
    pub negative: bool,
    pub digits: String,
    pub exponent: i32,
}

/// A JSON value; equal values are equal as Rust values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

/// How one value is written.
#[derive(Debug, Clone)]
pub struct Spelling {
    /// Whitespace between tokens (each use takes the next, cycling).
    pub spaces: Vec<&'static str>,
    /// Trailing zeros added to a number's digits, and where its decimal point goes.
    pub number_shapes: Vec<(u8, u8)>,
    /// Whether object keys are written in reverse order.
    pub reverse_keys: bool,
    /// Whether strings escape every character that may be escaped.
    pub escape_all: bool,
}

pub fn number() -> impl Strategy<Value = Number> {
    prop_oneof![
        Just(Number {
            negative: false,
            digits: String::new(),
            exponent: 0
        }),
        (any::<bool>(), "[1-9]([0-9]{0,30}[1-9])?", -40i32..40).prop_map(
            |(negative, digits, exponent)| Number {
                negative,
                digits,
                exponent
            }
        ),
        // Small integers, so equal values come up between independent draws.
        (any::<bool>(), 1u8..4).prop_map(|(negative, n)| Number {
            negative,
            digits: n.to_string(),
            exponent: 0
        }),
        // Distinct values one double cannot tell apart.
        prop::sample::select(vec![
            ("1", -1),
            ("10000000000000001", -17),
            ("18446744073709551617", 0),
            ("18446744073709551619", 0),
        ])
        .prop_map(|(digits, exponent)| Number {
            negative: false,
            digits: digits.to_string(),
            exponent
        }),
    ]
}

/// Values from a small alphabet when `small`, so that independent draws are often equal.
pub fn json(small: bool) -> impl Strategy<Value = Json> {
    let text = if small { "[ab]{0,2}" } else { "\\PC{0,12}" };
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        number().prop_map(Json::Number),
        proptest::string::string_regex(text)
            .unwrap()
            .prop_map(Json::String),
        any::<String>().prop_map(Json::String),
    ];
    let (depth, width) = if small { (2, 3) } else { (4, 6) };
    leaf.prop_recursive(depth, 48, width, move |inner| {
        let key = proptest::string::string_regex(if small { "[ab]" } else { "\\PC{0,8}" }).unwrap();
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..width as usize).prop_map(Json::Array),
            prop::collection::btree_map(key, inner, 0..width as usize).prop_map(Json::Object),
        ]
    })
}

pub fn spelling() -> impl Strategy<Value = Spelling> {
    (
        prop::collection::vec(
            prop_oneof![Just(""), Just(" "), Just("\n  "), Just("\t")],
            1..5,
        ),
        prop::collection::vec((0u8..4, 0u8..40), 1..5),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(spaces, number_shapes, reverse_keys, escape_all)| Spelling {
                spaces,
                number_shapes,
                reverse_keys,
                escape_all,
            },
        )
}

/// The compact text serde_json writes.
pub fn compact(value: &Json) -> String {
    let plain = Spelling {
        spaces: vec![""],
        number_shapes: vec![(0, 0)],
        reverse_keys: false,
        escape_all: false,
    };
    write(value, &plain)
}

/// `value` written as `spelling` says.
pub fn write(value: &Json, spelling: &Spelling) -> String {
    let mut out = String::new();
    let mut turn = 0usize;
    write_into(value, spelling, &mut turn, &mut out);
    out
}

fn space(spelling: &Spelling, turn: &mut usize) -> &'static str {
    *turn += 1;
    spelling.spaces[*turn % spelling.spaces.len()]
}

fn write_into(value: &Json, s: &Spelling, turn: &mut usize, out: &mut String) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => {
            *turn += 1;
            out.push_str(&write_number(
                n,
                s.number_shapes[*turn % s.number_shapes.len()],
            ))
        }
        Json::String(text) => out.push_str(&write_string(text, s.escape_all)),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(space(s, turn));
                write_into(item, s, turn, out);
            }
            out.push_str(space(s, turn));
            out.push(']');
        }
        Json::Object(members) => {
            out.push('{');
            let mut entries: Vec<_> = members.iter().collect();
            if s.reverse_keys {
                entries.reverse();
            }
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(space(s, turn));
                out.push_str(&write_string(key, s.escape_all));
                out.push_str(space(s, turn));
                out.push(':');
                out.push_str(space(s, turn));
                write_into(item, s, turn, out);
            }
            out.push_str(space(s, turn));
            out.push('}');
        }
    }
}

/// A number with `zeros` trailing zeros added and its decimal point `point` digits from the
/// right (at most all of them), and the exponent that keeps its value.
fn write_number(n: &Number, (zeros, point): (u8, u8)) -> String {
    if n.digits.is_empty() {
        return ["0", "0.0", "0e5", "-0"][(zeros % 4) as usize].to_string();
    }
    let digits = format!("{}{}", n.digits, "0".repeat(zeros as usize));
    let point = (point as usize).min(digits.len());
    let exponent = n.exponent as i64 - zeros as i64 + point as i64;
    let (int, frac) = digits.split_at(digits.len() - point);
    let mut text = String::new();
    if n.negative {
        text.push('-');
    }
    text.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        text.push('.');
        text.push_str(frac);
    }
    if exponent != 0 {
        text.push_str(&format!("e{exponent}"));
    }
    text
}

fn write_string(text: &str, escape_all: bool) -> String {
    if !escape_all {
        return serde_json::to_string(text).unwrap();
    }
    let mut out = String::from("\"");
    for unit in text.encode_utf16() {
        out.push_str(&format!("\\u{unit:04x}"));
    }
    out.push('"');
    out
}
