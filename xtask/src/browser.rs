//! The browser the dashboard test drives: Debian's Chromium (installed when missing) and
//! `playwright-core` from `tests/browser`'s committed lockfile (`npm ci`, offline-safe and
//! reproducible). The test finds Chromium at `/usr/bin/chromium` (or `$CHROMIUM`).

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::polyglot::stale;
use crate::services::{apt_install, installed};
use crate::tools::{root, run};

/// Install Chromium and the Playwright driver if they are missing.
pub fn ensure_browser() -> Result<()> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !installed(&chromium) {
        eprintln!("xtask: Chromium is missing (the dashboard test drives it): installing it");
        apt_install("chromium")?;
    }
    let project: PathBuf = root().join("tests/browser");
    if stale(
        &project.join("node_modules/.package-lock.json"),
        &[project.join("package-lock.json")],
    ) {
        let mut ci = Command::new("npm");
        ci.args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&project);
        run(ci)?;
    }
    Ok(())
}
