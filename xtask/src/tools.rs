//! Running commands and installing missing tools.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A `cargo` command (the same cargo that runs xtask) in the workspace root.
pub fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args).current_dir(root());
    cmd
}

/// `cargo nextest run` of one test binary of the `wharf-tests` package.
pub fn nextest_one(test: &str) -> Command {
    cargo(&["nextest", "run", "--package", "wharf-tests", "--test", test])
}

/// Run a command, failing with its command line when it fails.
pub fn run(mut cmd: Command) -> Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("xtask: {line}");
    let status = cmd.status().with_context(|| format!("starting {line}"))?;
    if !status.success() {
        bail!("{line} failed with {status}");
    }
    Ok(())
}

/// A command started by [`start`], with its command line.
pub struct Running(std::process::Child, String);

/// Start a command without waiting for it.
pub fn start(mut cmd: Command) -> Result<Running> {
    let line = format!("{cmd:?}");
    eprintln!("xtask: {line} (in the background)");
    let child = cmd.spawn().with_context(|| format!("starting {line}"))?;
    Ok(Running(child, line))
}

/// Wait for a command [`start`] started, failing with its command line when it fails.
pub fn wait(running: Running) -> Result<()> {
    let Running(mut child, line) = running;
    let status = child
        .wait()
        .with_context(|| format!("waiting for {line}"))?;
    if !status.success() {
        bail!("{line} failed with {status}");
    }
    Ok(())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

/// Make sure the `wasm32-wasip2` target is installed.
pub fn ensure_wasm_target() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup (is the Rust toolchain installed with rustup?)")?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == "wasm32-wasip2")
    {
        return Ok(());
    }
    let mut add = Command::new("rustup");
    add.args(["target", "add", "wasm32-wasip2"]);
    run(add)
}

/// Make sure `cargo nextest` is available.
pub fn ensure_nextest() -> Result<()> {
    if succeeds(cargo(&["nextest", "--version"]).stdout(std::process::Stdio::null())) {
        return Ok(());
    }
    run(cargo(&["install", "cargo-nextest", "--locked"]))
}

/// Build every sample and fixture handler: Rust (release, wasm32-wasip2), JavaScript and
/// Python.
pub fn build_guests() -> Result<()> {
    ensure_wasm_target()?;
    let mut cmd = cargo(&["build", "--release", "--target", "wasm32-wasip2"]);
    cmd.current_dir(root().join("sample-handlers"));
    run(cmd)?;
    crate::polyglot::build_js()?;
    crate::polyglot::build_python()
}

/// Where a built guest is.
pub fn guest(crate_name: &str) -> PathBuf {
    root()
        .join("sample-handlers/target/wasm32-wasip2/release")
        .join(format!("{crate_name}.wasm"))
}

/// The pinned validator of Kubernetes manifests (PyPI; ships the schemas of the built-in kinds,
/// so no API server is needed).
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// The Python of a venv in `target/tools/kubernetes-validate` holding [`KUBERNETES_VALIDATE`],
/// installed when missing. The manifest test runs `deploy/kubernetes/validate.py` with it.
pub fn ensure_kubernetes_validate() -> Result<PathBuf> {
    let venv = root().join("target/tools/kubernetes-validate");
    let python = venv.join("bin/python");
    let pinned = venv.join("pinned.txt");
    if std::fs::read_to_string(&pinned).ok().as_deref() != Some(KUBERNETES_VALIDATE) {
        eprintln!("xtask: installing {KUBERNETES_VALIDATE} (validates the Kubernetes manifests)");
        let mut create = Command::new("python3");
        create.args(["-m", "venv"]).arg(&venv);
        run(create)?;
        let mut install = Command::new(venv.join("bin/pip"));
        install.args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            KUBERNETES_VALIDATE,
        ]);
        run(install)?;
        std::fs::write(&pinned, KUBERNETES_VALIDATE)?;
    }
    Ok(python)
}
