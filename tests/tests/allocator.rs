//! The `wharf` binary runs on jemalloc with its settings applied: freed pages are purged by
//! jemalloc's background thread, which only exists when the settings the binary exports
//! were read (without them an idle host keeps the pages its handlers' compilation freed).

use std::time::Duration;

use wharf_tests::{TestDir, poll_until, spawn_wharf};

/// The names of the threads of process `pid`.
fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}

#[tokio::test]
async fn the_host_purges_freed_memory_from_jemallocs_background_thread() {
    let dir = TestDir::new();
    dir.write_config("");
    let host = spawn_wharf(dir.dir.path());
    let pid = host.id();
    let purging = poll_until(Duration::from_secs(30), || async {
        thread_names(pid)
            .iter()
            .any(|n| n.starts_with("jemalloc_bg"))
            .then_some(())
    })
    .await;
    assert!(
        purging.is_some(),
        "no jemalloc background thread in `wharf run`; its threads: {:?}; log: {}",
        thread_names(pid),
        std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default()
    );
}
