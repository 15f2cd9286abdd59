//! The Kubernetes manifests in `deploy/kubernetes/`, offline: every document valid for its
//! kind (`validate.py`: kubernetes-validate for built-in kinds, the in-repo schemas for KEDA's
//! and the Prometheus Operator's), and what ties them to Wharf — the ConfigMap's `wharf.toml`
//! passes `wharf config check` with the Secret's variables, the grace period is above
//! `shutdown_grace`, the probes and the ServiceMonitor reach the admin port, and the KEDA
//! PostgreSQL query counts the ready messages of a real store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use wharf_tests::{PgSchema, TestDir, database_url, msg, wharf_binary};

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// The Python that has kubernetes-validate (`cargo xtask test` installs it).
fn python() -> PathBuf {
    let path = std::env::var_os("WHARF_KUBERNETES_VALIDATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/tools/kubernetes-validate/bin/python")
        });
    assert!(
        path.exists(),
        "{} is missing: `cargo xtask test` installs kubernetes-validate there",
        path.display()
    );
    path
}

/// Every document of every manifest, validated: (file, document).
fn documents() -> Vec<(String, Value)> {
    let out = std::process::Command::new(python())
        .arg(manifests().join("validate.py"))
        .output()
        .expect("running validate.py");
    assert!(
        out.status.success(),
        "a manifest is invalid:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).expect("validate.py prints JSON");
    all.into_iter()
        .map(|d| {
            (
                d["file"].as_str().unwrap().to_string(),
                d["document"].clone(),
            )
        })
        .collect()
}

fn find<'d>(docs: &'d [(String, Value)], kind: &str, name: &str) -> &'d Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

#[test]
fn every_manifest_is_valid_and_fits_the_host() {
    let docs = documents();
    let kinds: Vec<&str> = docs
        .iter()
        .map(|(_, d)| d["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "ScaledObject",
        "TriggerAuthentication",
    ] {
        assert!(kinds.contains(&kind), "no {kind} among {kinds:?}");
    }
    assert_eq!(
        kinds.iter().filter(|k| **k == "ScaledObject").count(),
        3,
        "the PostgreSQL, Prometheus and Kafka examples"
    );

    // The ConfigMap's wharf.toml is a valid configuration with the Secret's variables.
    let dir = TestDir::new();
    let toml = find(&docs, "ConfigMap", "wharf")["data"]["wharf.toml"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(dir.path("wharf.toml"), &toml).unwrap();
    let secret = &find(&docs, "Secret", "wharf")["stringData"];
    let out = std::process::Command::new(wharf_binary())
        .current_dir(dir.dir.path())
        .args(["config", "check", "wharf.toml"])
        .env("HOST_ID", "wharf-0")
        .env("DATABASE_URL", secret["DATABASE_URL"].as_str().unwrap())
        .env(
            "WHARF_ADMIN_TOKEN",
            secret["WHARF_ADMIN_TOKEN"].as_str().unwrap(),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the ConfigMap's wharf.toml: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let config: toml::Table = toml.parse().unwrap();
    let grace =
        humantime::parse_duration(config["host"]["shutdown_grace"].as_str().unwrap()).unwrap();
    assert_eq!(config["host"]["handlers_source"].as_str(), Some("store"));
    let port: u16 = config["host"]["admin_listen"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    // The Deployment: grace above shutdown_grace, probes on the admin port, the config mounted
    // where the arguments point, HOST_ID and the Secret's variables in the environment.
    let deployment = find(&docs, "Deployment", "wharf");
    let pod = &deployment["spec"]["template"]["spec"];
    let termination = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        Duration::from_secs(termination) > grace,
        "terminationGracePeriodSeconds {termination} must be above shutdown_grace {grace:?}"
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["ports"][0],
        json!({"name": "admin", "containerPort": port})
    );
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "config")
        .unwrap()["mountPath"]
        .as_str()
        .unwrap();
    assert_eq!(args, ["--config", &format!("{mount}/wharf.toml"), "run"]);
    assert_eq!(container["envFrom"][0]["secretRef"]["name"], "wharf");
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "HOST_ID")
    );
    assert_eq!(
        pod["securityContext"]["runAsNonRoot"], true,
        "the pod runs as a non-root user"
    );

    // The ServiceMonitor scrapes the Service's admin port, which is the container's.
    let service = find(&docs, "Service", "wharf");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "admin");
    let monitor = find(&docs, "ServiceMonitor", "wharf");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "admin");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");

    // The Prometheus scaler's metric is one the host exports (docs/operations.md lists it).
    let prometheus = find(&docs, "ScaledObject", "wharf-oldest-ready");
    let query = prometheus["spec"]["triggers"][0]["metadata"]["query"]
        .as_str()
        .unwrap();
    assert!(
        query.contains("wharf_queue_oldest_ready_seconds"),
        "{query}"
    );
    for scaled in docs.iter().filter(|(_, d)| d["kind"] == "ScaledObject") {
        assert_eq!(scaled.1["spec"]["scaleTargetRef"]["name"], "wharf");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keda_postgresql_query_counts_the_ready_messages() {
    let docs = documents();
    let scaled = find(&docs, "ScaledObject", "wharf-ready-messages");
    let query = scaled["spec"]["triggers"][0]["metadata"]["query"]
        .as_str()
        .unwrap()
        .to_string();
    let schema = PgSchema::new();
    let store = wharf_host::queue::open(&database_url(), Some(&schema.name), 2)
        .await
        .unwrap();
    for n in 0..3 {
        store
            .enqueue("orders", msg(json!({ "n": n })), false)
            .await
            .unwrap();
    }
    // Not ready yet: scheduled for later.
    let mut later = msg(json!({ "n": 99 }));
    later.process_at_ms = Some(wharf_host::clock::now_ms() + 3_600_000);
    store.enqueue("orders", later, false).await.unwrap();
    store.enqueue("other", msg(json!({})), false).await.unwrap();

    let pool = sqlx::PgPool::connect(&database_url()).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET search_path TO \"{}\"",
        schema.name
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    let (ready,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(query.clone()))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(ready, 3, "{query}");
}
