//! `cargo xtask image`: a container image of the `wharf` binary, built with buildah from this
//! machine's files — nothing is pulled from an image registry. The image holds the release
//! binary, the shared libraries it links (as `ldd` lists them), the CA certificates, the time
//! zone database and a passwd/group naming the non-root user 10001; no shell, no package
//! manager. It runs `wharf` as user 10001 with `/etc/wharf/wharf.toml` as its configuration.
//! After building, it runs the image once (`wharf --version`, then `wharf config check` on a
//! configuration mounted in) when the machine can run containers, and says so when it cannot.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::tools::{self, root};

/// The image's name.
pub const IMAGE: &str = "localhost/wharf:latest";

/// Files taken from this machine into the image as they are (when present).
const SYSTEM_FILES: &[&str] = &["/etc/ssl/certs/ca-certificates.crt", "/usr/share/zoneinfo"];

pub fn run() -> Result<()> {
    for tool in ["buildah", "podman"] {
        if which(tool).is_none() {
            bail!(
                "`{tool}` is missing: install it with `sudo apt-get install buildah podman` (Debian's packages), then run `cargo xtask image` again"
            );
        }
    }
    tools::run(tools::cargo(&[
        "build",
        "--release",
        "--package",
        "wharf-host",
        "--bin",
        "wharf",
    ]))?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from);
    let binary = target.join("release/wharf");
    let rootfs = root().join("target/image/rootfs");
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)?;
    }
    std::fs::create_dir_all(&rootfs)?;
    copy_into(&rootfs, &binary, Path::new("/usr/local/bin/wharf"))?;
    // The release build keeps debug information for profiles; the image does not need it.
    let mut strip = Command::new("strip");
    strip.arg(rootfs.join("usr/local/bin/wharf"));
    tools::run(strip)?;
    for library in libraries(&binary)? {
        copy_into(&rootfs, &library, &library)?;
    }
    for file in SYSTEM_FILES {
        let path = Path::new(file);
        if path.exists() {
            copy_into(&rootfs, path, path)?;
        }
    }
    write(
        &rootfs,
        "etc/passwd",
        "wharf:x:10001:10001:wharf:/var/lib/wharf:/sbin/nologin\n",
    )?;
    write(&rootfs, "etc/group", "wharf:x:10001:\n")?;
    for dir in ["etc/wharf", "var/lib/wharf", "var/cache/wharf", "tmp"] {
        std::fs::create_dir_all(rootfs.join(dir))?;
    }
    let owned = ["var/lib/wharf", "var/cache/wharf"];
    let mut chown = Command::new("chown");
    chown.args(["-R", "10001:10001"]);
    chown.args(owned.iter().map(|d| rootfs.join(d)));
    tools::run(chown)?;

    let container = output(Command::new("buildah").args(["from", "scratch"]))?;
    let result = (|| {
        let mut copy = Command::new("buildah");
        copy.args(["copy", &container])
            .arg(format!("{}/", rootfs.display()))
            .arg("/");
        tools::run(copy)?;
        let mut config = Command::new("buildah");
        config.args([
            "config",
            "--user",
            "10001:10001",
            "--workingdir",
            "/var/lib/wharf",
            "--env",
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
            "--entrypoint",
            r#"["/usr/local/bin/wharf"]"#,
            "--cmd",
            r#"["--config", "/etc/wharf/wharf.toml", "run"]"#,
            "--port",
            "9464",
            "--label",
            "org.opencontainers.image.title=wharf",
            &container,
        ]);
        tools::run(config)?;
        let mut commit = Command::new("buildah");
        commit.args(["commit", "--rm", &container, IMAGE]);
        tools::run(commit)
    })();
    if result.is_err() {
        let _ = Command::new("buildah").args(["rm", &container]).status();
    }
    result?;
    let size =
        output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", IMAGE]))?;
    eprintln!(
        "xtask: built {IMAGE} ({} MB)",
        size.parse::<u64>().unwrap_or(0) / 1_000_000
    );
    try_run()
}

/// Run the image once: its version, and `config check` of a mounted configuration.
fn try_run() -> Result<()> {
    let version = Command::new("podman")
        .args(["run", "--rm", IMAGE, "--version"])
        .output()
        .context("running podman")?;
    if !version.status.success() {
        eprintln!(
            "xtask: the image was built, but this machine could not run it with podman: {}",
            String::from_utf8_lossy(&version.stderr).trim()
        );
        return Ok(());
    }
    eprintln!(
        "xtask: the image runs: {}",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    let dir = root().join("target/image/check");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("wharf.toml"),
        "[host]\nhandlers_source = \"store\"\n\n[storage]\nurl = \"sqlite:///var/lib/wharf/wharf.db\"\n\n[queues.orders]\nhandler = \"export-order\"\n",
    )?;
    let mut check = Command::new("podman");
    check
        .args(["run", "--rm", "-v"])
        .arg(format!("{}:/etc/wharf:ro", dir.display()))
        .args([
            IMAGE,
            "--config",
            "/etc/wharf/wharf.toml",
            "config",
            "check",
        ]);
    tools::run(check)?;
    eprintln!("xtask: `wharf config check` ran in the image as user 10001");
    Ok(())
}

/// The shared libraries `binary` loads, with the dynamic loader, as absolute paths.
fn libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let listing = output(Command::new("ldd").arg(binary))?;
    let mut out = Vec::new();
    for line in listing.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux-x86-64.so.2 (0x…)`
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            out.push(PathBuf::from(path));
        }
    }
    if out.is_empty() {
        bail!("ldd listed no library of {}:\n{listing}", binary.display());
    }
    Ok(out)
}

/// Copy `from` (a file or directory, links followed) to `to` inside `rootfs`.
fn copy_into(rootfs: &Path, from: &Path, to: &Path) -> Result<()> {
    let target = rootfs.join(to.strip_prefix("/").unwrap_or(to));
    std::fs::create_dir_all(target.parent().expect("a path inside the root"))?;
    let mut cp = Command::new("cp");
    cp.args(["-rL"]).arg(from).arg(&target);
    tools::run(cp)
}

fn write(rootfs: &Path, path: &str, text: &str) -> Result<()> {
    let target = rootfs.join(path);
    std::fs::create_dir_all(target.parent().expect("a path inside the root"))?;
    Ok(std::fs::write(target, text)?)
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(tool))
            .find(|p| p.exists())
    })
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
