//! The initial linear memory a component asks for, read from its bytes before it is
//! compiled: a handler whose memory cap is below it could never be instantiated, so it is
//! rejected at deploy time instead of failing every message.

use wasmparser::{Parser, Payload, TypeRef};

/// The largest initial size (bytes) of any memory the component's core modules define or
/// import; `None` when it has none or cannot be read (compiling reports that).
pub fn largest_initial_memory(bytes: &[u8]) -> Option<u64> {
    let mut largest: Option<u64> = None;
    let mut note = |ty: wasmparser::MemoryType| {
        let page = 1u64 << ty.page_size_log2.unwrap_or(16);
        let size = ty.initial.saturating_mul(page);
        largest = Some(largest.map_or(size, |l| l.max(size)));
    };
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.ok()? {
            Payload::MemorySection(memories) => {
                for memory in memories {
                    note(memory.ok()?);
                }
            }
            Payload::ImportSection(imports) => {
                for import in imports.into_imports() {
                    if let TypeRef::Memory(ty) = import.ok()?.ty {
                        note(ty);
                    }
                }
            }
            _ => {}
        }
    }
    largest
}
