//! `cargo xtask bench`: the benchmarks of `wharf-host`, built once, then run one by one with
//! the time each took, so the whole run's cost is visible per benchmark.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{services, tools};

/// Run every benchmark (or only what `args` selects, passed on to `cargo bench`), printing how
/// long the build and each benchmark took.
pub fn run(args: &[String]) -> Result<()> {
    // The services and the guests get ready while the benchmarks compile: the compiler
    // leaves a core idle for long stretches (one large crate at a time).
    let started = Instant::now();
    let ready = std::thread::spawn(|| -> Result<()> {
        services::ensure_postgres()?;
        services::ensure_redis()?;
        services::ensure_rabbitmq()?;
        services::ensure_kafka()?;
        tools::build_guests()
    });
    let built = tools::run(tools::cargo(&[
        "bench",
        "--package",
        "wharf-host",
        "--no-run",
    ]));
    let ready = ready
        .join()
        .map_err(|_| anyhow::anyhow!("getting the services and guests ready panicked"))?;
    built?;
    ready?;
    let mut timings = vec![(
        "build (benches, guests, services)".to_string(),
        started.elapsed(),
    )];

    if args.is_empty() {
        for name in bench_names()? {
            let started = Instant::now();
            tools::run(tools::cargo(&[
                "bench",
                "--package",
                "wharf-host",
                "--bench",
                &name,
            ]))?;
            timings.push((format!("--bench {name}"), started.elapsed()));
            // Printed as each one ends too, so a run stopped half way still shows its costs.
            eprintln!("xtask: --bench {name} took {}", minutes(started.elapsed()));
        }
    } else {
        let started = Instant::now();
        let mut cmd = tools::cargo(&["bench", "--package", "wharf-host"]);
        cmd.args(args);
        tools::run(cmd)?;
        timings.push((format!("cargo bench {}", args.join(" ")), started.elapsed()));
    }

    let total: Duration = timings.iter().map(|(_, took)| *took).sum();
    println!("\n| step | took |\n|---|---|");
    for (step, took) in &timings {
        println!("| {step} | {} |", minutes(*took));
    }
    println!("| total | {} |", minutes(total));
    Ok(())
}

/// The `[[bench]]` targets of `wharf-host`, in name order (as `cargo metadata` lists them).
fn bench_names() -> Result<Vec<String>> {
    let out = tools::cargo(&["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("reading cargo metadata's output")?;
    let host = meta["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|p| p["name"] == "wharf-host"))
        .context("cargo metadata lists no wharf-host package")?;
    let names: Vec<String> = host["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.contains(&"bench".into()))
        })
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    if names.is_empty() {
        bail!("wharf-host declares no [[bench]] targets");
    }
    Ok(names)
}

fn minutes(took: Duration) -> String {
    let secs = took.as_secs();
    format!("{}:{:02} min", secs / 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_benchmark_is_found() {
        let names = bench_names().unwrap();
        let manifest =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../host/Cargo.toml"))
                .unwrap();
        let mut declared: Vec<&str> = manifest
            .split("[[bench]]")
            .skip(1)
            .filter_map(|section| {
                section
                    .lines()
                    .find_map(|line| line.trim().strip_prefix("name = "))
                    .map(|name| name.trim_matches('"'))
            })
            .collect();
        assert!(!declared.is_empty());
        declared.sort_unstable();
        assert_eq!(names, declared);
    }

    #[test]
    fn durations_print_as_minutes_and_seconds() {
        assert_eq!(minutes(Duration::from_secs(0)), "0:00 min");
        assert_eq!(minutes(Duration::from_secs(61)), "1:01 min");
        assert_eq!(minutes(Duration::from_secs(1234)), "20:34 min");
    }
}
