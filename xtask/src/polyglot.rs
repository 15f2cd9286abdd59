//! Handlers in JavaScript and Python, built offline and reproducibly:
//!
//! - JavaScript: `npm ci` in `sample-handlers/js` from its committed lockfile, then
//!   `jco componentize … --backend qjs --backend-qjs-disable-async` (QuickJS, synchronous:
//!   no component-model async needed) for each `NAME.js` in `sample-handlers/js` and its
//!   `fixtures/`; `componentize-js` (SpiderMonkey) for the sample (`-d http fetch-event`)
//!   and for each handler in `spidermonkey/`, which call `fetch` (`-d fetch-event`);
//! - Python: `componentize-py`, pinned in `sample-handlers/python/requirements.txt`,
//!   installed in a venv under `target/tools/componentize-py`, for each `NAME/app.py` in
//!   `sample-handlers/python` and its `fixtures/`.
//!
//! Components go to `sample-handlers/target/js/NAME.wasm` (QuickJS),
//! `sample-handlers/target/js-spidermonkey/NAME.wasm` and
//! `sample-handlers/target/python/NAME.wasm`; one is rebuilt only when its source, the WIT
//! or the toolchain pin is newer. Without Node (or Python) that language is skipped with a
//! message — except under CI (`CI` set), where a missing toolchain is an error.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};

use crate::tools::{root, run};

/// Where the components of `lang` (`js`, `python`) are written.
fn out_dir(lang: &str) -> PathBuf {
    root().join("sample-handlers/target").join(lang)
}

/// Wharf's WIT folder: `handler.wit`, `state.wit` and the `wasi:keyvalue` WIT in `deps/`.
fn wit() -> PathBuf {
    root().join("wit")
}

/// The WIT files a handler is built from (a change builds it again).
fn wit_files() -> Vec<PathBuf> {
    let mut files = vec![wit().join("handler.wit"), wit().join("state.wit")];
    if let Ok(deps) = std::fs::read_dir(wit().join("deps/keyvalue")) {
        files.extend(deps.filter_map(|e| e.ok()).map(|e| e.path()));
    }
    files
}

/// The world a handler targets: `handler-with-state` (key-value state) for a source whose
/// name starts with `state`, `handler` for the others.
fn world(source: &Path) -> &'static str {
    let name = source
        .parent()
        .filter(|_| source.ends_with("app.py"))
        .unwrap_or(source)
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    match name.starts_with("state") {
        true => "handler-with-state",
        false => "handler",
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Whether `output` is older than any of `inputs` (or missing).
pub(crate) fn stale(output: &Path, inputs: &[PathBuf]) -> bool {
    let Some(built) = modified(output) else {
        return true;
    };
    inputs.iter().any(|i| modified(i).is_none_or(|m| m > built))
}

fn available(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Skip a language whose toolchain is missing, or fail under CI.
fn missing(program: &str, lang: &str) -> Result<()> {
    if std::env::var_os("CI").is_some() {
        bail!(
            "`{program}` is not installed: the {lang} handlers cannot be built (required under CI)"
        );
    }
    eprintln!(
        "xtask: `{program}` is not installed: skipping the {lang} handlers (their tests fail until they are built)"
    );
    Ok(())
}

/// The handlers of a language folder: its own and those of its `fixtures/`.
fn sources(dir: &Path, python: bool) -> Result<Vec<(String, PathBuf)>> {
    let mut all = fixtures(dir, python)?;
    all.extend(fixtures(&dir.join("fixtures"), python)?);
    Ok(all)
}

/// The sources under `dir` that are `NAME.js` files or `NAME/app.py` folders.
fn fixtures(dir: &Path, python: bool) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let source = if python {
            path.join("app.py")
        } else {
            path.clone()
        };
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let wanted = if python {
            source.exists()
        } else {
            path.extension().is_some_and(|e| e == "js")
        };
        if wanted {
            out.push((name.to_string(), source));
        }
    }
    out.sort();
    Ok(out)
}

/// Build the JavaScript handlers.
pub fn build_js() -> Result<()> {
    if !available("node") || !available("npm") {
        return missing("node", "JavaScript");
    }
    let project = root().join("sample-handlers/js");
    let lock = project.join("package-lock.json");
    if stale(
        &project.join("node_modules/.package-lock.json"),
        std::slice::from_ref(&lock),
    ) {
        let mut ci = Command::new("npm");
        ci.args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&project);
        run(ci)?;
    }
    let quickjs = out_dir("js");
    let spidermonkey = out_dir("js-spidermonkey");
    std::fs::create_dir_all(&quickjs)?;
    std::fs::create_dir_all(&spidermonkey)?;
    let mut builds: Vec<(PathBuf, PathBuf, Engine)> = Vec::new();
    for (name, source) in sources(&project, false)? {
        let target = quickjs.join(format!("{name}.wasm"));
        builds.push((source, target, Engine::QuickJs));
    }
    // The sample again on SpiderMonkey (for the per-message cost), without `fetch`…
    let sample = project.join("order-export.js");
    builds.push((
        sample,
        spidermonkey.join("order-export.wasm"),
        Engine::SpiderMonkey { http: false },
    ));
    // …and the handlers that call `fetch`, which only SpiderMonkey offers.
    for (name, source) in fixtures(&project.join("spidermonkey"), false)? {
        let target = spidermonkey.join(format!("{name}.wasm"));
        builds.push((source, target, Engine::SpiderMonkey { http: true }));
    }
    for (source, target, engine) in builds {
        let mut inputs = wit_files();
        inputs.extend([source.clone(), lock.clone()]);
        if stale(&target, &inputs) {
            run(componentize(&project, engine, &source, &target))?;
        }
    }
    Ok(())
}

/// The JavaScript engine a component embeds.
#[derive(Clone, Copy)]
enum Engine {
    /// QuickJS (jco's `qjs` backend), synchronous: small and quick to start.
    QuickJs,
    /// SpiderMonkey (componentize-js); with `http`, `fetch` is available and the component
    /// imports `wasi:http`.
    SpiderMonkey { http: bool },
}

fn componentize(project: &Path, engine: Engine, source: &Path, target: &Path) -> Command {
    let bin = project.join("node_modules/.bin");
    let mut cmd = match engine {
        Engine::QuickJs => {
            let mut jco = Command::new(bin.join("jco"));
            jco.arg("componentize").arg(source);
            jco
        }
        Engine::SpiderMonkey { .. } => {
            let mut cjs = Command::new(bin.join("componentize-js"));
            cjs.arg(source);
            cjs
        }
    };
    cmd.arg("--wit")
        .arg(wit())
        .args(["--world-name", world(source)]);
    match engine {
        Engine::QuickJs => cmd.args(["--backend", "qjs", "--backend-qjs-disable-async"]),
        Engine::SpiderMonkey { http: true } => cmd.args(["-d", "fetch-event"]),
        Engine::SpiderMonkey { http: false } => cmd.args(["-d", "http", "fetch-event"]),
    };
    cmd.arg("-o").arg(target).current_dir(project);
    cmd
}

/// Build the Python handlers.
pub fn build_python() -> Result<()> {
    if !available("python3") {
        return missing("python3", "Python");
    }
    let requirements = root().join("sample-handlers/python/requirements.txt");
    let venv = root().join("target/tools/componentize-py");
    let tool = venv.join("bin/componentize-py");
    let pinned = venv.join("pinned.txt");
    if stale(&pinned, std::slice::from_ref(&requirements)) || !tool.exists() {
        let mut create = Command::new("python3");
        create.args(["-m", "venv"]).arg(&venv);
        run(create)?;
        let mut install = Command::new(venv.join("bin/pip"));
        install
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(&requirements);
        run(install)?;
        std::fs::copy(&requirements, &pinned)?;
    }
    let out = out_dir("python");
    std::fs::create_dir_all(&out)?;
    for (name, source) in sources(&root().join("sample-handlers/python"), true)? {
        let target = out.join(format!("{name}.wasm"));
        let mut inputs = wit_files();
        inputs.extend([source.clone(), requirements.clone()]);
        if !stale(&target, &inputs) {
            continue;
        }
        let mut build = Command::new(&tool);
        build
            .arg("-d")
            .arg(wit())
            .args(["-w", world(&source), "componentize", "app", "-o"])
            .arg(&target)
            .current_dir(source.parent().expect("NAME/app.py"));
        run(build)?;
    }
    Ok(())
}
