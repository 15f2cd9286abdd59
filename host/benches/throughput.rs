//! Throughput on the user's path, every row from one run, rounds interleaved
//! (`WHARF_BENCH_ROUNDS`, default 2; `WHARF_BENCH_MESSAGES`, default 100,000):
//!
//! - **enqueue**: `wharf enqueue bench --file` of the whole backlog (the release CLI, process
//!   start and schema checks included, as a user runs it);
//! - **drain**: that backlog processed by a no-op guest, timed between 1 % and 99 %
//!   processed — a warm host: start-up, the handler's compile and the deploy are before the
//!   window. Drain only: the enqueue is its own row.
//!
//! For SQLite, PostgreSQL and Redis (external pending storage), each with the inbox off and
//! on, with the queue defaults and tuned (`concurrency = 128`, `batch = 128`).
//! `WHARF_BENCH_STORES=sqlite,postgres,redis` picks stores. The runs share one
//! compiled-component cache, so the no-op guest compiles once (outside every window anyway).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Instant;

use wharf_host::Config;

use common::{PROCESSED, database_url, median};

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

/// Messages per run unless `WHARF_BENCH_MESSAGES` says otherwise: the backlog the table in
/// docs/performance.md and the project's throughput goals are stated for (a smaller backlog
/// drains faster, as the SQL stores' lease scans and indexes are smaller).
const MESSAGES: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Sqlite,
    Postgres,
    Redis,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Sqlite => "SQLite",
            Store::Postgres => "PostgreSQL",
            Store::Redis => "Redis",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Row {
    store: Store,
    inbox: bool,
    tuned: bool,
}

impl Row {
    fn label(self) -> String {
        format!(
            "{:<10} inbox {:<3} {}",
            self.store.name(),
            if self.inbox { "on" } else { "off" },
            if self.tuned {
                "tuned (128/128)"
            } else {
                "queue defaults"
            }
        )
    }
}

/// Where one run keeps its messages, removed afterwards.
struct Place {
    dir: tempfile::TempDir,
    tag: String,
}

impl Place {
    fn new(run: usize) -> Self {
        Place {
            dir: tempfile::tempdir().unwrap(),
            tag: format!("{}_{run}", std::process::id()),
        }
    }

    fn config(&self, row: Row, cache: &Path) -> PathBuf {
        let tag = &self.tag;
        let mut text = format!(
            "[host]\nadmin_listen = \"127.0.0.1:0\"\ncache_dir = \"{}\"\n[storage]\n",
            cache.display()
        );
        text += &match row.store {
            Store::Sqlite => "url = \"sqlite://bench.db\"\n".to_string(),
            _ => format!(
                "url = \"{}\"\nschema = \"wharf_tp_{tag}\"\nmax_connections = 16\n",
                database_url()
            ),
        };
        if row.inbox && row.store == Store::Redis {
            text += &format!(
                "[inbox.redis]\nurl = \"{}\"\nkey_prefix = \"wharf-tp:{tag}:inbox:\"\n",
                common::redis_url()
            );
        }
        text += "[queues.bench]\nhandler = \"noop\"\n";
        if row.tuned {
            text += "concurrency = 128\nbatch = 128\n";
        }
        if row.inbox {
            let store = if row.store == Store::Redis {
                "redis"
            } else {
                "sql"
            };
            text += &format!("inbox = {{ store = \"{store}\" }}\n");
        }
        if row.store == Store::Redis {
            text += &format!(
                "storage = \"external\"\nprovider = \"main\"\n[providers.main]\ntype = \"redis\"\n\
                 url = \"{}\"\nkey_prefix = \"wharf-tp:{tag}:\"\n",
                common::redis_url()
            );
        }
        let path = self.dir.path().join("wharf.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    async fn clean(&self, store: Store) {
        match store {
            Store::Sqlite => {}
            Store::Postgres => {}
            Store::Redis => common::delete_redis_keys(&format!("wharf-tp:{}:", self.tag)).await,
        }
        if store != Store::Sqlite {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
            let sql = format!("DROP SCHEMA IF EXISTS wharf_tp_{} CASCADE", self.tag);
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
}

/// Enqueue `messages` with the CLI, then drain them in a host. Returns (enqueue, drain) msg/s.
async fn run_once(row: Row, messages: u64, run: usize, cache: &Path) -> (f64, f64) {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let place = Place::new(run);
    let config = place.config(row, cache);
    let lines: String = (0..messages)
        .map(|n| format!("{{\"order_id\":\"{n}\",\"customer\":\"Ada\",\"total_cents\":1999}}\n"))
        .collect();
    let file = place.dir.path().join("messages.jsonl");
    std::fs::write(&file, lines).unwrap();

    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .arg("--config")
        .arg(&config)
        .args(["enqueue", "bench", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    let enqueue_s = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "wharf enqueue failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::create_dir_all(place.dir.path().join("handlers")).unwrap();
    std::fs::copy(&guest, place.dir.path().join("handlers/noop.wasm")).unwrap();
    let base = PROCESSED.load(Ordering::Relaxed);
    let host = wharf_host::start(Config::load(&config).unwrap())
        .await
        .unwrap();
    let drain = common::time_drain(base, messages, &row.label()).await;
    host.shutdown().await;
    place.clean(row.store).await;
    (messages as f64 / enqueue_s, drain)
}

fn main() {
    if common::filtered_out("throughput enqueue drain sqlite postgres redis") {
        return;
    }
    common::count_processed();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let messages: u64 = std::env::var("WHARF_BENCH_MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(MESSAGES);
    // One compiled-component cache for every run: the guest compiles once.
    let cache = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    let picked = std::env::var("WHARF_BENCH_STORES")
        .unwrap_or_default()
        .to_lowercase();
    for store in [Store::Postgres, Store::Sqlite, Store::Redis] {
        if !picked.is_empty() && !picked.contains(&store.name().to_lowercase()[..4]) {
            continue;
        }
        for inbox in [false, true] {
            for tuned in [false, true] {
                rows.push(Row {
                    store,
                    inbox,
                    tuned,
                });
            }
        }
    }
    let mut enqueues: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut drains: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut run = 0;
    for round in 1..=common::rounds() {
        for (i, row) in rows.iter().enumerate() {
            run += 1;
            let (enqueue, drain) = rt.block_on(run_once(*row, messages, run, cache.path()));
            println!(
                "round {round}: {}  enqueue {enqueue:>7.0} msg/s  drain {drain:>7.0} msg/s",
                row.label()
            );
            enqueues[i].push(enqueue);
            drains[i].push(drain);
        }
    }
    println!(
        "\n{messages} messages, medians over {} rounds:",
        common::rounds()
    );
    println!("| store | inbox | queue settings | enqueue (CLI, msg/s) | drain (1 %–99 %, msg/s) |");
    println!("|---|---|---|---|---|");
    for (i, row) in rows.iter().enumerate() {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} |",
            row.store.name(),
            if row.inbox { "on" } else { "off" },
            if row.tuned {
                "concurrency 128, batch 128"
            } else {
                "defaults"
            },
            median(enqueues[i].clone()),
            median(drains[i].clone()),
        );
    }
}
