//! `wharf handlers new NAME --lang rust|js|python`: a handler project that builds with one
//! command, with the WIT contract copied in (and for Rust the `wharf-guest` SDK, so the
//! project uses the API the docs show and builds outside this repository).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The languages a new handler project can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust with the `wharf-guest` SDK (`cargo build --release`).
    Rust,
    /// JavaScript with jco and the QuickJS engine (`npm install && npm run build`).
    Js,
    /// Python with componentize-py (`./build.sh`).
    Python,
}

const WIT: &str = include_str!("../../../wit/handler.wit");

/// The rest of the WIT folder: the world with key-value state and the `wasi:keyvalue` WIT
/// it imports (the SDK builds against that world; JavaScript and Python projects may too).
const WIT_STATE: [(&str, &str); 6] = [
    ("wit/state.wit", include_str!("../../../wit/state.wit")),
    (
        "wit/deps/keyvalue/store.wit",
        include_str!("../../../wit/deps/keyvalue/store.wit"),
    ),
    (
        "wit/deps/keyvalue/atomic.wit",
        include_str!("../../../wit/deps/keyvalue/atomic.wit"),
    ),
    (
        "wit/deps/keyvalue/batch.wit",
        include_str!("../../../wit/deps/keyvalue/batch.wit"),
    ),
    (
        "wit/deps/keyvalue/watch.wit",
        include_str!("../../../wit/deps/keyvalue/watch.wit"),
    ),
    (
        "wit/deps/keyvalue/world.wit",
        include_str!("../../../wit/deps/keyvalue/world.wit"),
    ),
];

/// Every file of a project in `lang`: (path, content, executable).
fn files(lang: Lang) -> Vec<(&'static str, &'static str, bool)> {
    match lang {
        Lang::Rust => vec![
            (
                "Cargo.toml",
                include_str!("templates/rust_Cargo.toml"),
                false,
            ),
            (
                ".cargo/config.toml",
                include_str!("templates/rust_config.toml"),
                false,
            ),
            ("src/lib.rs", include_str!("templates/rust_lib.rs"), false),
            (".gitignore", "/target\n", false),
            // The SDK the docs show, copied in: its bindings read `../wit`, the project's copy
            // of the contract.
            (
                "wharf-guest/Cargo.toml",
                include_str!("templates/rust_sdk_Cargo.toml"),
                false,
            ),
            (
                "wharf-guest/src/lib.rs",
                include_str!("../../../guest-sdk/src/lib.rs"),
                false,
            ),
            (
                "wharf-guest/src/log.rs",
                include_str!("../../../guest-sdk/src/log.rs"),
                false,
            ),
            (
                "wharf-guest/src/message.rs",
                include_str!("../../../guest-sdk/src/message.rs"),
                false,
            ),
            (
                "wharf-guest/src/outbox.rs",
                include_str!("../../../guest-sdk/src/outbox.rs"),
                false,
            ),
            (
                "wharf-guest/src/state.rs",
                include_str!("../../../guest-sdk/src/state.rs"),
                false,
            ),
        ],
        Lang::Js => vec![
            (
                "package.json",
                include_str!("templates/js_package.json"),
                false,
            ),
            ("handler.js", include_str!("templates/js_handler.js"), false),
            (".gitignore", "/node_modules\n*.wasm\n", false),
        ],
        Lang::Python => vec![
            ("app.py", include_str!("templates/python_app.py"), false),
            (
                "requirements.txt",
                include_str!("templates/python_requirements.txt"),
                false,
            ),
            ("build.sh", include_str!("templates/python_build.sh"), true),
            (".gitignore", "/.venv\n__pycache__/\n*.wasm\n", false),
        ],
    }
}

/// The one build command of a project, and where it puts the component.
pub fn build_command(lang: Lang, name: &str) -> (String, String) {
    match lang {
        Lang::Rust => (
            "cargo build --release".to_string(),
            format!(
                "target/wasm32-wasip2/release/{}.wasm",
                name.replace('-', "_")
            ),
        ),
        Lang::Js => (
            "npm install && npm run build".to_string(),
            format!("{name}.wasm"),
        ),
        Lang::Python => ("./build.sh".to_string(), format!("{name}.wasm")),
    }
}

/// Write project `name` in `lang` into `dir` (which must not exist or be empty).
pub fn write_project(name: &str, lang: Lang, dir: &Path) -> anyhow::Result<PathBuf> {
    if !crate::config::is_valid_name(name) || name.contains('.') {
        bail!("`{name}` is not a valid handler name (letters, digits, `_` and `-`)");
    }
    if dir.exists()
        && std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_some()
    {
        bail!(
            "{} exists and is not empty: choose another name or --dir",
            dir.display()
        );
    }
    let (build, output) = build_command(lang, name);
    let readme = format!(
        "# {name}\n\nA Wharf message handler.\n\nBuild: `{build}` → `{output}`.\n\nDeploy: copy it into the host's handlers directory as `{name}.wasm` (atomically: copy to a temporary name, then rename), and route a queue to it with `handler = \"{name}\"`.\n"
    );
    let mut all = files(lang);
    all.push(("wit/handler.wit", WIT, false));
    all.extend(WIT_STATE.iter().map(|(path, text)| (*path, *text, false)));
    for (path, content, executable) in all {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&target, content.replace("{{name}}", name))
            .with_context(|| format!("writing {}", target.display()))?;
        if executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    std::fs::write(dir.join("README.md"), readme)?;
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_has_its_name_and_the_contract() {
        for lang in [Lang::Rust, Lang::Js, Lang::Python] {
            let dir = tempfile::tempdir().unwrap();
            let project = dir.path().join("greeter");
            write_project("greeter", lang, &project).unwrap();
            assert_eq!(
                std::fs::read_to_string(project.join("wit/handler.wit")).unwrap(),
                WIT
            );
            let readme = std::fs::read_to_string(project.join("README.md")).unwrap();
            assert!(
                readme.contains(&build_command(lang, "greeter").0),
                "{readme}"
            );
            for (path, _, _) in files(lang) {
                let text = std::fs::read_to_string(project.join(path)).unwrap();
                assert!(!text.contains("{{name}}"), "{path}");
            }
            if lang == Lang::Rust {
                // The SDK is in the project, its bindings pointed at the project's WIT.
                let cargo = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
                assert!(cargo.contains(r#"wharf-guest = { path = "wharf-guest" }"#));
                let sdk = std::fs::read_to_string(project.join("wharf-guest/src/lib.rs")).unwrap();
                assert!(sdk.contains(r#"path: "../wit""#), "{sdk}");
                let lib = std::fs::read_to_string(project.join("src/lib.rs")).unwrap();
                assert!(lib.contains("impl Handler for") && lib.contains("export_handler!"));
            }
            let again = write_project("greeter", lang, &project).unwrap_err();
            assert!(again.to_string().contains("not empty"), "{again}");
        }
        let bad = write_project("no/way", Lang::Rust, Path::new("/nonexistent")).unwrap_err();
        assert!(
            bad.to_string().contains("not a valid handler name"),
            "{bad}"
        );
    }
}
