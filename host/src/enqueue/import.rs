//! The JSON Lines import of `wharf enqueue QUEUE --file`: every non-blank line is one message
//! payload, based on a template, with its id taken from a JSON pointer when asked (a string's
//! text, or a number exactly as written: `12345678901234567890123` keeps every digit). The
//! whole text is checked before anything is enqueued: the first bad line stops the import and
//! is named by its number.

use std::collections::HashMap;

use serde_json::value::RawValue;

use super::EnqueueError;
use crate::queue::NewMessage;

/// Why a line cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The line is not JSON.
    #[error("{line}: not valid JSON; nothing was enqueued: {reason}")]
    NotJson {
        /// Its number, from 1.
        line: usize,
        /// The parser's message.
        reason: String,
    },
    /// The id pointer finds no string or number.
    #[error("{line}: no string or number at `{pointer}`; nothing was enqueued")]
    NoId {
        /// Its number, from 1.
        line: usize,
        /// The `--id-from` or `--session-from` pointer.
        pointer: String,
    },
    /// The message is refused by the queue (a limit).
    #[error("{line}: nothing was enqueued: {refusal}")]
    Refused {
        /// Its number, from 1.
        line: usize,
        /// Why (printed, not wrapped).
        refusal: EnqueueError,
    },
}

impl ImportError {
    /// The number of the line (from 1).
    pub fn line(&self) -> usize {
        match self {
            ImportError::NotJson { line, .. }
            | ImportError::NoId { line, .. }
            | ImportError::Refused { line, .. } => *line,
        }
    }
}

/// Where each line's id and session key are read (JSON pointers); `None` keeps the
/// template's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pointers<'a> {
    /// `--id-from`.
    pub id: Option<&'a str>,
    /// `--session-from`.
    pub session: Option<&'a str>,
}

/// The messages of every non-blank line of `text`, in order, each based on `template` (its id
/// from the JSON pointer `id_from` when given) and accepted by `check`.
pub fn parse_lines(
    text: &str,
    pointers: Pointers<'_>,
    template: &NewMessage,
    check: impl Fn(&NewMessage) -> Result<(), EnqueueError>,
) -> Result<Vec<NewMessage>, ImportError> {
    let mut messages = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let number = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        serde_json::from_str::<serde::de::IgnoredAny>(line).map_err(|e| ImportError::NotJson {
            line: number,
            reason: e.to_string(),
        })?;
        let read = |pointer: Option<&str>, default: &Option<String>| match pointer {
            None => Ok(default.clone()),
            Some(pointer) => id_at(line, pointer)
                .map(Some)
                .ok_or_else(|| ImportError::NoId {
                    line: number,
                    pointer: pointer.to_string(),
                }),
        };
        let id = read(pointers.id, &template.id)?;
        let session = read(pointers.session, &template.session)?;
        let message = NewMessage {
            id,
            session,
            payload: line.to_string(),
            ..template.clone()
        };
        check(&message).map_err(|refusal| ImportError::Refused {
            line: number,
            refusal,
        })?;
        messages.push(message);
    }
    Ok(messages)
}

/// The id at the JSON `pointer` (RFC 6901) in `line`: a string's text, or a number's text as
/// written; `None` for anything else or nothing there.
fn id_at(line: &str, pointer: &str) -> Option<String> {
    let mut raw: &RawValue = serde_json::from_str(line).ok()?;
    if !pointer.is_empty() {
        for segment in pointer.strip_prefix('/')?.split('/') {
            raw = child(raw, &segment.replace("~1", "/").replace("~0", "~"))?;
        }
    }
    let text = raw.get();
    match text.as_bytes().first()? {
        b'"' => serde_json::from_str::<String>(text).ok(),
        b'-' | b'0'..=b'9' => Some(text.to_string()),
        _ => None,
    }
}

/// The member `token` of an object, or the item at index `token` of an array.
fn child<'a>(raw: &'a RawValue, token: &str) -> Option<&'a RawValue> {
    match raw.get().as_bytes().first()? {
        // Of duplicate keys the last counts, as for the payload itself.
        b'{' => serde_json::from_str::<HashMap<String, &RawValue>>(raw.get())
            .ok()?
            .get(token)
            .copied(),
        b'[' => {
            if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
                return None;
            }
            let index: usize = token.parse().ok()?;
            serde_json::from_str::<Vec<&RawValue>>(raw.get())
                .ok()?
                .get(index)
                .copied()
        }
        _ => None,
    }
}
