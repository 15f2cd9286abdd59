//! The JSON Lines import: any text is imported line for line (blank lines skipped, each
//! payload the line as written, in file order) or refused as a whole, naming the first bad
//! line; ids come from the pointer as strings or number text.

use proptest::prelude::*;
use wharf_host::enqueue::{ImportError, Pointers, parse_lines};
use wharf_host::queue::NewMessage;

use super::json::{Json, json, number, spelling, write};

fn accept(_: &NewMessage) -> Result<(), wharf_host::enqueue::EnqueueError> {
    Ok(())
}

/// Lines of JSON (any spelling, on one line) and blank lines.
fn lines() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            4 => (json(false), spelling()).prop_map(|(v, s)| write(&v, &s).replace(['\n', '\r'], " ")),
            1 => prop_oneof![Just(String::new()), Just("   ".to_string()), Just("\t".to_string())],
        ],
        0..20,
    )
}

proptest! {
    #![proptest_config(super::runner(256))]

    #[test]
    fn any_text_imports_or_names_a_line(text in any::<String>()) {
        match parse_lines(&text, Pointers::default(), &NewMessage::default(), accept) {
            Ok(messages) => {
                let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
                prop_assert_eq!(messages.len(), lines.len());
                for (message, line) in messages.iter().zip(lines) {
                    prop_assert_eq!(&message.payload, line);
                }
            }
            Err(e) => prop_assert!(e.line() >= 1 && e.line() <= text.lines().count().max(1)),
        }
    }

    #[test]
    fn json_lines_import_in_order(lines in lines()) {
        let text = lines.join("\n");
        let messages = parse_lines(&text, Pointers::default(), &NewMessage::default(), accept).unwrap();
        let expected: Vec<&String> = lines.iter().filter(|l| !l.trim().is_empty()).collect();
        prop_assert_eq!(messages.len(), expected.len());
        for (message, line) in messages.iter().zip(expected) {
            prop_assert_eq!(&message.payload, line);
        }
    }

    #[test]
    fn the_first_bad_line_is_named(lines in lines(), bad in "[^\\n\\r]{1,10}", at in any::<prop::sample::Index>()) {
        prop_assume!(serde_json::from_str::<serde::de::IgnoredAny>(&bad).is_err() && !bad.trim().is_empty());
        let mut lines = lines;
        let at = at.index(lines.len() + 1);
        lines.insert(at, bad);
        let text = lines.join("\n");
        match parse_lines(&text, Pointers::default(), &NewMessage::default(), accept) {
            Err(e @ ImportError::NotJson { .. }) => prop_assert_eq!(e.line(), at + 1),
            other => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn ids_come_from_the_pointer(
        id in prop_oneof![any::<String>().prop_map(Json::String), number().prop_map(Json::Number)],
        written in spelling(),
    ) {
        let text = write(&id, &written);
        let line = format!("{{\"order\":{{\"id\":{text}, \"n\":[1, {text}]}}}}");
        let expected = match &id {
            Json::String(s) => s.clone(),
            _ => text.clone(), // a number exactly as written, every digit kept
        };
        for pointer in ["/order/id", "/order/n/1"] {
            let messages = parse_lines(&line, Pointers { id: Some(pointer), ..Pointers::default() }, &NewMessage::default(), accept).unwrap();
            prop_assert_eq!(messages[0].id.as_deref(), Some(expected.as_str()));
        }
        for missing in ["/order/x", "/order/n/01", "/order/n/2", "/order"] {
            let refused = parse_lines(&line, Pointers { id: Some(missing), ..Pointers::default() }, &NewMessage::default(), accept);
            prop_assert!(matches!(refused, Err(ImportError::NoId { line: 1, .. })), "{missing}");
        }
    }
}
