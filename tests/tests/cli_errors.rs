//! Errors reach the user once: a command that fails on the database or on a missing file
//! prints the underlying reason one time, not once per wrapping layer.

use wharf_tests::{TestDir, database_url};

/// How often `needle` occurs in `haystack`.
fn occurrences(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn a_database_error_is_printed_once() {
    let dir = TestDir::new();
    // The configured server, with a database that does not exist.
    let server = database_url();
    let base = server
        .rsplit_once('/')
        .map_or(server.as_str(), |(base, _)| base);
    dir.write_config_with_storage(
        &format!("url = \"{base}/wharf_no_such_database\""),
        "[queues.work]\nhandler = \"none\"\n",
    );
    let (ok, _, stderr) = dir.wharf(&["messages", "list"]);
    assert!(!ok);
    assert_eq!(
        occurrences(&stderr, "\"wharf_no_such_database\" does not exist"),
        1,
        "{stderr}"
    );
}

#[test]
fn an_unreadable_sqlite_file_is_reported_once() {
    let dir = TestDir::new();
    dir.write_config_with_storage(
        "url = \"sqlite://missing-folder/wharf.db\"",
        "[queues.work]\nhandler = \"none\"\n",
    );
    let (ok, _, stderr) = dir.wharf(&["enqueue", "work", "{}"]);
    assert!(!ok);
    assert_eq!(
        occurrences(&stderr, "unable to open database file"),
        1,
        "{stderr}"
    );
}

#[test]
fn a_missing_config_file_is_reported_once() {
    let dir = TestDir::new();
    let (ok, _, stderr) = dir.wharf(&["messages", "list"]);
    assert!(!ok);
    assert!(stderr.contains("wharf.toml"), "{stderr}");
    assert_eq!(
        occurrences(&stderr, "No such file or directory"),
        1,
        "{stderr}"
    );
}
