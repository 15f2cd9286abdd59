//! Property tests of the parsers and the enqueue paths that take input from outside: broker
//! envelopes, the configuration loader (TOML and interpolation), the JSON Lines import, the
//! canonical JSON of idempotent queues, and a guest's `host.enqueue` with hostile arguments on
//! SQLite and PostgreSQL. Each property runs a fixed number of generated cases (proptest's
//! default 256, or `PROPTEST_CASES`; `cargo xtask fuzz` runs a longer budget). A failing case
//! is shrunk and saved beside its test file (`*.regressions`), and replayed first from then on.

mod canonical;
mod config;
mod envelope;
mod guest_enqueue;
mod import;
mod json;

use proptest::test_runner::{Config, FileFailurePersistence};

/// The runner configuration: `cases` (scaled by `PROPTEST_CASES` when set, relative to 256),
/// failures saved beside the test file.
pub fn runner(cases: u32) -> Config {
    let scale = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(1.0, |n| f64::from(n) / 256.0);
    Config {
        cases: ((f64::from(cases) * scale) as u32).max(1),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..Config::default()
    }
}
