//! Traces over OTLP/HTTP, received by an in-repo collector (`opentelemetry-proto` decoding)
//! from a `wharf run` process: `wharf enqueue` with a producer's `traceparent` → processed →
//! the handler's follow-up → processed, and the handler's HTTP calls to a local server, form
//! one trace with the right parents; the server sees the injected `traceparent`; sampled at 0
//! nothing is exported, and the decision still travels to the server.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;
use wharf_tests::{Lang, TestDir, poll_until, spawn_wharf, spawn_wharf_with};

const T: Duration = Duration::from_secs(60);

/// The producer's own trace context, given with `wharf enqueue --header`.
const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver keeping every span it is sent.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    async fn start(&self) -> u16 {
        let spans = self.spans.clone();
        let app = Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut kept = spans.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        kept.extend(scope.spans);
                    }
                }
                ExportTraceServiceResponse::default().encode_to_vec()
            }),
        );
        serve(app).await
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// A local HTTP server recording the `traceparent` of every `GET /hook`; `GET /flaky`
/// fails its first request.
#[derive(Clone, Default)]
struct Service {
    seen: Arc<Mutex<Vec<Option<String>>>>,
}

impl Service {
    async fn start(&self) -> u16 {
        let seen = self.seen.clone();
        let calls = seen.clone();
        let app = Router::new()
            .route(
                "/hook",
                get(move |headers: HeaderMap| async move {
                    let parent = headers
                        .get("traceparent")
                        .map(|v| v.to_str().unwrap().to_string());
                    seen.lock().unwrap().push(parent);
                    "ok"
                }),
            )
            // Fails the first request it gets, answers the others.
            .route(
                "/flaky",
                get(move || async move {
                    let mut calls = calls.lock().unwrap();
                    calls.push(None);
                    match calls.len() {
                        1 => (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not yet"),
                        _ => (axum::http::StatusCode::OK, "ok"),
                    }
                }),
            );
        serve(app).await
    }

    fn seen(&self) -> Vec<Option<String>> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(app: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

/// Queue `first` calls the service, then enqueues into `second`, which calls it again.
fn host_dir(collector: u16, service: u16, telemetry: &str) -> TestDir {
    host_dir_on(collector, service, telemetry, None)
}

/// [`host_dir`] with both queues' pending messages in the broker `[providers.main]`
/// (`provider`) describes.
fn host_dir_on(collector: u16, service: u16, telemetry: &str, provider: Option<&str>) -> TestDir {
    let dir = TestDir::new();
    dir.deploy_in("caller", Lang::JsSpiderMonkey, "fetch");
    let (storage, providers) = match provider {
        Some(provider) => (
            "storage = \"external\"\nprovider = \"main\"",
            format!("[providers.main]\n{provider}\n[external]\nreconcile_interval = \"300ms\"\n"),
        ),
        None => ("", String::new()),
    };
    dir.write_config(&format!(
        r#"
[telemetry]
traces = true
endpoint = "http://127.0.0.1:{collector}"
{telemetry}

[handlers.caller]
allowed_outbound_hosts = ["http://127.0.0.1:{service}"]

[queues.first]
handler = "caller"
max_attempts = 1
{storage}

[queues.second]
handler = "caller"
max_attempts = 1
{storage}

{providers}"#
    ));
    dir
}

fn payload(service: u16) -> String {
    let url = format!("http://127.0.0.1:{service}/hook");
    json!({
        "url": url,
        "method": "GET",
        "then": { "queue": "second", "payload": { "url": url, "method": "GET" } },
    })
    .to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_its_follow_up_and_their_http_calls_form_one_trace() {
    let (collector, service) = (Collector::default(), Service::default());
    let service_port = service.start().await;
    let dir = host_dir(collector.start().await, service_port, "");
    let _host = spawn_wharf_with(dir.dir.path(), &["--log-format", "json"]);
    let producer = format!("traceparent=00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01");
    let (ok, out, err) = dir.wharf(&[
        "enqueue",
        "first",
        "--header",
        &producer,
        &payload(service_port),
    ]);
    assert!(ok, "wharf enqueue: {out}{err}");

    // Both deliveries done and exported: each `process` span ends after its settlement.
    let spans = poll_until(T, || {
        let spans = collector.spans();
        let done = ["process first", "process second"]
            .iter()
            .all(|name| spans.iter().any(|s| s.name == *name))
            && spans.iter().filter(|s| s.name == "GET").count() == 2;
        async move { done.then_some(spans) }
    })
    .await
    .unwrap_or_else(|| {
        let log = std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default();
        panic!(
            "the spans never arrived: {:?}\n{log}",
            collector
                .spans()
                .iter()
                .map(|s| &s.name)
                .collect::<Vec<_>>()
        )
    });

    let by_name = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let one = |name: &str| -> &Span {
        let found = by_name(name);
        assert_eq!(found.len(), 1, "one `{name}` span: {found:?}");
        found[0]
    };
    for span in &spans {
        assert_eq!(
            hex(&span.trace_id),
            PRODUCER_TRACE,
            "`{}` is in the producer's trace",
            span.name
        );
    }
    let parent_of = |span: &Span| hex(&span.parent_span_id);
    let id = |span: &Span| hex(&span.span_id);

    let send_first = one("send first");
    assert_eq!(
        parent_of(send_first),
        PRODUCER_SPAN,
        "the producer's span is the parent"
    );
    let process_first = one("process first");
    assert_eq!(parent_of(process_first), id(send_first));
    assert_eq!(
        attribute(process_first, "messaging.system").as_deref(),
        Some("wharf")
    );
    assert_eq!(
        attribute(process_first, "messaging.destination.name").as_deref(),
        Some("first")
    );
    assert_eq!(
        attribute(process_first, "wharf.outcome").as_deref(),
        Some("completed")
    );
    assert_eq!(
        attribute(process_first, "wharf.attempt").as_deref(),
        Some("1")
    );
    let handles = by_name("handle");
    let handle_first = handles
        .iter()
        .find(|s| parent_of(s) == id(process_first))
        .expect("a `handle` span under `process first`");
    assert!(
        by_name("instantiate")
            .iter()
            .any(|s| parent_of(s) == id(process_first)),
        "`instantiate` under `process first`"
    );
    assert_eq!(parent_of(one("settle first")), id(process_first));
    assert!(
        handle_first.events.iter().any(|e| e
            .attributes
            .iter()
            .any(|a| format!("{:?}", a.value).contains("fetched"))),
        "the guest's log line is an event of its `handle` span: {:?}",
        handle_first.events
    );

    let send_second = one("send second");
    assert_eq!(
        parent_of(send_second),
        id(handle_first),
        "the follow-up is sent by the call"
    );
    let process_second = one("process second");
    assert_eq!(parent_of(process_second), id(send_second));
    let handle_second = handles
        .iter()
        .find(|s| parent_of(s) == id(process_second))
        .expect("a `handle` span under `process second`");

    // Each HTTP call is a client span under its call, and the service saw its context.
    let calls = by_name("GET");
    let mut parents: Vec<String> = calls.iter().map(|s| parent_of(s)).collect();
    parents.sort();
    let mut handles_ids = vec![id(handle_first), id(handle_second)];
    handles_ids.sort();
    assert_eq!(parents, handles_ids, "one request span under each call");
    let seen: Vec<String> = service
        .seen()
        .into_iter()
        .map(|p| p.expect("a traceparent"))
        .collect();
    let mut expected: Vec<String> = calls
        .iter()
        .map(|s| format!("00-{PRODUCER_TRACE}-{}-01", id(s)))
        .collect();
    let mut seen_sorted = seen.clone();
    seen_sorted.sort();
    expected.sort();
    assert_eq!(
        seen_sorted, expected,
        "the service continues the trace of each request span"
    );
    // The JSON log line of the guest's `log` call carries its call's trace and span.
    let log = std::fs::read_to_string(dir.path("wharf.log")).unwrap();
    let line: serde_json::Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("fetched"))
        })
        .unwrap_or_else(|| panic!("the guest's line in the JSON log:\n{log}"));
    assert_eq!(line["fields"]["trace_id"], PRODUCER_TRACE, "{line}");
    assert_eq!(line["fields"]["span_id"], id(handle_first), "{line}");

    // The message API (and the dashboard's message page) names the message's trace.
    let key: i64 = out
        .split("key ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("the key in {out:?}"));
    let url = format!("http://{}/api/v1/messages/{key}", admin_address(&dir).await);
    let detail: serde_json::Value = tokio::task::spawn_blocking(move || {
        let text = ureq::get(&url)
            .call()
            .unwrap()
            .into_body()
            .read_to_string()
            .unwrap();
        serde_json::from_str(&text).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(detail["trace_id"], PRODUCER_TRACE, "{detail}");

    let statuses: BTreeMap<String, Option<String>> = calls
        .iter()
        .map(|s| (id(s), attribute(s, "http.response.status_code")))
        .collect();
    assert!(
        statuses.values().all(|s| s.as_deref() == Some("200")),
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_at_zero_nothing_is_exported_and_the_decision_travels() {
    let (collector, service) = (Collector::default(), Service::default());
    let service_port = service.start().await;
    let dir = host_dir(collector.start().await, service_port, "sample_ratio = 0.0");
    let mut host = spawn_wharf(dir.dir.path());
    // A message without a trace: none is started, and no header is added.
    let (ok, out, err) = dir.wharf(&["enqueue", "first", &payload(service_port)]);
    assert!(ok, "wharf enqueue: {out}{err}");
    let seen = poll_until(T, || {
        let seen = service.seen();
        async move { (seen.len() == 2).then_some(seen) }
    })
    .await
    .expect("both calls reached the service");
    assert_eq!(
        seen,
        vec![None, None],
        "no trace context on a message without one"
    );
    // A producer's trace it decided not to sample: the decision travels, nothing is recorded.
    let producer = format!("traceparent=00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-00");
    let (ok, out, err) = dir.wharf(&[
        "enqueue",
        "first",
        "--header",
        &producer,
        &payload(service_port),
    ]);
    assert!(ok, "wharf enqueue: {out}{err}");
    let seen = poll_until(T, || {
        let seen = service.seen();
        async move { (seen.len() == 4).then_some(seen) }
    })
    .await
    .expect("both calls reached the service");
    for parent in &seen[2..] {
        let parent = parent.as_deref().expect("the producer's context");
        assert!(
            parent.starts_with(&format!("00-{PRODUCER_TRACE}-")) && parent.ends_with("-00"),
            "not sampled, in the producer's trace: {parent}"
        );
    }
    // A graceful stop exports every queued span before the process exits.
    host.terminate();
    assert_eq!(
        collector.spans().len(),
        0,
        "nothing exported: {:?}",
        collector
            .spans()
            .iter()
            .map(|s| &s.name)
            .collect::<Vec<_>>()
    );
}

/// `text` without its terminal color sequences.
fn without_colors(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The host's admin address, from its log.
async fn admin_address(dir: &TestDir) -> String {
    poll_until(T, || {
        let log = std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default();
        let log = without_colors(&log);
        // `admin_addr=ADDRESS` in text logs, `"admin_addr":"ADDRESS"` in JSON ones.
        let address = log
            .split("admin_addr")
            .nth(1)
            .map(|rest| rest.trim_start_matches(['=', '"', ':']))
            .and_then(|rest| rest.split(['"', ' ', '\n']).next())
            .map(str::to_string);
        async move { address }
    })
    .await
    .expect("the host logs its admin address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_drops_spans_and_processing_goes_on() {
    // Accepts connections and requests, answers none.
    let app = Router::new().route("/v1/traces", post(std::future::pending::<&'static str>));
    let silent = serve(app).await;
    let dir = TestDir::new();
    dir.deploy("noop", "noop");
    dir.write_config(&format!(
        r#"
[telemetry]
traces = true
endpoint = "http://127.0.0.1:{silent}"
max_queued_spans = 16

[queues.work]
handler = "noop"
"#
    ));
    // One export gives up after the OTLP variable's timeout (1 s, not the default 10 s).
    let _host = wharf_tests::spawn_wharf_with_env(
        dir.dir.path(),
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")],
    );
    const N: u64 = 1000;
    let lines: String = (0..N).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    std::fs::write(dir.path("m.jsonl"), lines).unwrap();
    let (ok, out, err) = dir.wharf(&["enqueue", "work", "--file", "m.jsonl"]);
    assert!(ok, "wharf enqueue: {out}{err}");
    let store = dir.sqlite_store().await;
    let processed = poll_until(T, || {
        let store = store.clone();
        async move {
            let counts = store.counts("work").await.ok()?;
            let done = counts
                .iter()
                .find(|(s, _)| *s == wharf_host::queue::Status::Processed)
                .map_or(0, |(_, n)| *n);
            (done == N).then_some(done)
        }
    })
    .await;
    assert_eq!(
        processed,
        Some(N),
        "every message processed while no span got out"
    );
    let admin = admin_address(&dir).await;
    let dropped = poll_until(T, || {
        let admin = admin.clone();
        async move {
            let url = format!("http://{admin}/metrics");
            let body = tokio::task::spawn_blocking(move || {
                ureq::get(&url)
                    .call()
                    .ok()?
                    .into_body()
                    .read_to_string()
                    .ok()
            })
            .await
            .ok()??;
            body.lines()
                .find(|l| l.starts_with("wharf_trace_spans_dropped_total{reason=\"queue-full\"}"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .filter(|n| *n > 0.0)
        }
    })
    .await
    .expect("dropped spans are counted");
    // At most the queue and one batch in flight are kept: the rest of the 4 spans per
    // message in the host (process, instantiate, handle, settle) were dropped.
    assert!(
        dropped >= (4 * N - 16 - 2048) as f64,
        "{dropped} spans dropped of {}",
        4 * N
    );
    let gave_up = poll_until(T, || {
        let log = std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default();
        async move {
            log.contains("exporting spans failed: no answer within 1s")
                .then_some(())
        }
    })
    .await;
    assert!(
        gave_up.is_some(),
        "the export gave up after OTEL_EXPORTER_OTLP_TIMEOUT: {}",
        std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default()
    );
}

/// The spans of one run, looked up by name.
struct Spans(Vec<Span>);

impl Spans {
    /// Wait until `collector` has a `process` span of both queues.
    async fn of_both_deliveries(collector: &Collector, dir: &TestDir) -> Spans {
        let spans = poll_until(T, || {
            let spans = collector.spans();
            let done = ["process first", "process second"]
                .iter()
                .all(|name| spans.iter().any(|s| s.name == *name));
            async move { done.then_some(spans) }
        })
        .await
        .unwrap_or_else(|| {
            let log = std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default();
            let names: Vec<String> = collector.spans().into_iter().map(|s| s.name).collect();
            panic!("the spans never arrived: {names:?}\n{log}")
        });
        Spans(spans)
    }

    fn one(&self, name: &str) -> &Span {
        let found: Vec<&Span> = self.0.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one `{name}` span: {found:?}");
        found[0]
    }

    /// The `handle` span under `process`.
    fn handle_of(&self, process: &Span) -> &Span {
        self.0
            .iter()
            .find(|s| s.name == "handle" && s.parent_span_id == process.span_id)
            .unwrap_or_else(|| panic!("a `handle` span under `{}`", process.name))
    }
}

/// Enqueue into `first` of a host whose queues live in the broker `provider` describes, with
/// the producer's `traceparent` (and MessageId `order-1`), and return the spans of both
/// deliveries.
async fn through_broker(provider: &str) -> Spans {
    let (collector, service) = (Collector::default(), Service::default());
    let service_port = service.start().await;
    let dir = host_dir_on(collector.start().await, service_port, "", Some(provider));
    let _host = spawn_wharf(dir.dir.path());
    let producer = format!("traceparent=00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01");
    let args = ["enqueue", "first", "--id", "order-1", "--header", &producer];
    let (ok, out, err) = dir.wharf(&[&args[..], &[payload(service_port).as_str()]].concat());
    assert!(ok, "wharf enqueue: {out}{err}");
    Spans::of_both_deliveries(&collector, &dir).await
}

/// The trace a broker that carries headers keeps: the producer's span → `send first` →
/// `process first` → its call → `send second` (through the outbox) → `process second`.
fn assert_one_trace(spans: &Spans, system: &str) {
    for span in &spans.0 {
        assert_eq!(
            hex(&span.trace_id),
            PRODUCER_TRACE,
            "`{}` is in the producer's trace",
            span.name
        );
    }
    let send_first = spans.one("send first");
    assert_eq!(hex(&send_first.parent_span_id), PRODUCER_SPAN);
    assert_eq!(
        attribute(send_first, "messaging.system").as_deref(),
        Some(system)
    );
    let process_first = spans.one("process first");
    assert_eq!(
        process_first.parent_span_id, send_first.span_id,
        "the broker carried the context"
    );
    assert_eq!(
        attribute(process_first, "messaging.system").as_deref(),
        Some(system)
    );
    assert_eq!(
        attribute(process_first, "messaging.message.id").as_deref(),
        Some("order-1")
    );
    let send_second = spans.one("send second");
    assert_eq!(
        send_second.parent_span_id,
        spans.handle_of(process_first).span_id
    );
    let process_second = spans.one("process second");
    assert_eq!(
        process_second.parent_span_id, send_second.span_id,
        "the outbox row and the broker carried the follow-up's context"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_headers_carry_the_trace() {
    let prefix = wharf_tests::unique_prefix("traces").replace(':', ".");
    let provider = format!(
        "type = \"rabbitmq\"\nurl = \"{}\"\nexchange_prefix = \"{prefix}\"\nqueue_prefix = \"{prefix}\"\n",
        wharf_tests::amqp_url()
    );
    assert_one_trace(&through_broker(&provider).await, "rabbitmq");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_record_headers_carry_the_trace() {
    let prefix = wharf_tests::unique_prefix("traces").replace(':', ".");
    let provider = format!(
        "type = \"kafka\"\nbrokers = \"{}\"\ntopic_prefix = \"{prefix}\"\nprocessing_group = \"{prefix}processing\"\nreadiness_group = \"{prefix}readiness\"\n{}\n",
        wharf_tests::kafka::kafka_brokers(),
        wharf_tests::kafka::TEST_PROPERTIES
    );
    let spans = through_broker(&provider).await;
    assert_one_trace(&spans, "kafka");
    assert_eq!(
        attribute(spans.one("process first"), "messaging.consumer.group.name"),
        Some(format!("{prefix}processing"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servicebus_application_properties_carry_the_trace() {
    const KEY_NAME: &str = "RootManageSharedAccessKey";
    const KEY: &str = "dHJhY2VzLWtleQ==";
    let server = wharf_tests::servicebus::ContractServer::start(KEY_NAME, KEY).await;
    for topic in ["nexus.first", "nexus.second"] {
        server.create_topic(topic, &["processing", "readiness"]);
    }
    let provider = format!(
        "type = \"servicebus\"\nconnection_string = \"Endpoint=sb://traces.servicebus.windows.net/;SharedAccessKeyName={KEY_NAME};SharedAccessKey={KEY}\"\nendpoint_override = \"{}\"\n",
        server.endpoint()
    );
    assert_one_trace(&through_broker(&provider).await, "servicebus");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_envelope_and_starts_a_trace_per_delivery() {
    let provider = format!(
        "type = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"\n",
        wharf_tests::redis_url(),
        wharf_tests::unique_prefix("traces")
    );
    let spans = through_broker(&provider).await;
    let process_first = spans.one("process first");
    assert!(
        process_first.parent_span_id.is_empty(),
        "a new trace: {process_first:?}"
    );
    assert_ne!(hex(&process_first.trace_id), PRODUCER_TRACE);
    assert_eq!(
        attribute(process_first, "messaging.message.id").as_deref(),
        Some("order-1")
    );
    assert_eq!(
        attribute(process_first, "messaging.system").as_deref(),
        Some("redis")
    );
    // The producer's side is still one trace: its span → `send first`.
    assert_eq!(hex(&spans.one("send first").parent_span_id), PRODUCER_SPAN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_message_retried_from_sql_stays_in_its_trace() {
    let (collector, service) = (Collector::default(), Service::default());
    let service_port = service.start().await;
    let prefix = wharf_tests::unique_prefix("traces").replace(':', ".");
    let provider = format!(
        "type = \"rabbitmq\"\nurl = \"{}\"\nexchange_prefix = \"{prefix}\"\nqueue_prefix = \"{prefix}\"\n",
        wharf_tests::amqp_url()
    );
    let dir = host_dir_on(collector.start().await, service_port, "", Some(&provider));
    // `first` retries once, from the SQL queue, soon.
    let text = std::fs::read_to_string(dir.path("wharf.toml")).unwrap();
    let text = text.replacen(
        "max_attempts = 1",
        "max_attempts = 2\nbackoff = \"100ms\"",
        1,
    );
    std::fs::write(dir.path("wharf.toml"), text).unwrap();
    let _host = spawn_wharf(dir.dir.path());
    let producer = format!("traceparent=00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01");
    let payload =
        json!({ "url": format!("http://127.0.0.1:{service_port}/flaky"), "method": "GET" });
    let args = ["enqueue", "first", "--id", "order-1", "--header", &producer];
    let (ok, out, err) = dir.wharf(&[&args[..], &[payload.to_string().as_str()]].concat());
    assert!(ok, "wharf enqueue: {out}{err}");
    let spans = poll_until(T, || {
        let spans = collector.spans();
        let attempts = spans.iter().filter(|s| s.name == "process first").count();
        async move { (attempts == 2).then_some(spans) }
    })
    .await
    .expect("two attempts exported");
    let spans = Spans(spans);
    let send = spans.one("send first");
    let attempts: Vec<&Span> = spans
        .0
        .iter()
        .filter(|s| s.name == "process first")
        .collect();
    for attempt in &attempts {
        assert_eq!(hex(&attempt.trace_id), PRODUCER_TRACE);
        assert_eq!(
            attempt.parent_span_id, send.span_id,
            "both attempts under the one send"
        );
    }
    let systems: Vec<Option<String>> = attempts
        .iter()
        .map(|s| attribute(s, "messaging.system"))
        .collect();
    assert!(
        systems.contains(&Some("rabbitmq".into())) && systems.contains(&Some("wharf".into())),
        "the first attempt from the broker, the retry from the SQL queue: {systems:?}"
    );
    let outcomes: Vec<Option<String>> = attempts
        .iter()
        .map(|s| attribute(s, "wharf.outcome"))
        .collect();
    assert!(outcomes.contains(&Some("retried".into())), "{outcomes:?}");
    assert!(outcomes.contains(&Some("completed".into())), "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_producers_traceparent_on_rabbitmq_is_the_parent() {
    let (collector, service) = (Collector::default(), Service::default());
    let service_port = service.start().await;
    let prefix = wharf_tests::unique_prefix("traces").replace(':', ".");
    let url = wharf_tests::amqp_url();
    let provider = format!(
        "type = \"rabbitmq\"\nurl = \"{url}\"\nexchange_prefix = \"{prefix}\"\nqueue_prefix = \"{prefix}\"\n"
    );
    let dir = host_dir_on(collector.start().await, service_port, "", Some(&provider));
    let _host = spawn_wharf(dir.dir.path());
    // One message through the CLI first: the queue's topology exists once it is processed.
    let hook = format!("http://127.0.0.1:{service_port}/hook");
    let call = json!({ "url": hook, "method": "GET" });
    let (ok, out, err) = dir.wharf(&["enqueue", "first", &call.to_string()]);
    assert!(ok, "wharf enqueue: {out}{err}");
    let processed = |n: usize| {
        let collector = collector.clone();
        move || {
            let spans = collector.spans();
            let done = spans.iter().filter(|s| s.name == "process first").count() == n;
            async move { done.then_some(Spans(spans)) }
        }
    };
    poll_until(T, processed(1))
        .await
        .expect("the first message processed");

    // A producer outside Wharf publishes the envelope with its own context in the headers.
    let names = wharf_host::external::rabbitmq::RabbitSettings {
        exchange_prefix: prefix.clone(),
        queue_prefix: prefix.clone(),
        ..wharf_host::external::rabbitmq::RabbitSettings::new(url.clone())
    }
    .names("first");
    let mut headers = lapin::types::FieldTable::default();
    let parent = format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01");
    headers.insert(
        "traceparent".into(),
        lapin::types::AMQPValue::LongString(parent.into()),
    );
    let properties = lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    let body = wharf_tests::envelope_body(call, Some("direct-1"));
    wharf_tests::amqp_publish_with(&url, &names.exchange, "", &body, properties).await;
    let spans = poll_until(T, processed(2))
        .await
        .expect("the direct message processed");
    let direct = spans
        .0
        .iter()
        .find(|s| {
            s.name == "process first"
                && attribute(s, "messaging.message.id").as_deref() == Some("direct-1")
        })
        .expect("the direct message's process span");
    assert_eq!(hex(&direct.trace_id), PRODUCER_TRACE);
    assert_eq!(
        hex(&direct.parent_span_id),
        PRODUCER_SPAN,
        "the producer's span is the parent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_given_to_the_api_is_the_parent() {
    let (collector, service) = (Collector::default(), Service::default());
    let service_port = service.start().await;
    let dir = host_dir(collector.start().await, service_port, "");
    let _host = spawn_wharf(dir.dir.path());
    let url = format!(
        "http://{}/api/v1/queues/first/messages",
        admin_address(&dir).await
    );
    let body = json!({
        "payload": serde_json::from_str::<serde_json::Value>(&payload(service_port)).unwrap(),
        "headers": { "traceparent": format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01") },
    });
    let status = tokio::task::spawn_blocking(move || {
        let answer = ureq::post(&url)
            .content_type("application/json")
            .send(body.to_string());
        answer.map(|a| a.status().as_u16())
    })
    .await
    .unwrap()
    .expect("the API answers");
    assert_eq!(status, 201);
    let spans = Spans::of_both_deliveries(&collector, &dir).await;
    assert_one_trace_from_sql(&spans);
}

/// [`assert_one_trace`] for the SQL queue, whose messages have no MessageId here.
fn assert_one_trace_from_sql(spans: &Spans) {
    for span in &spans.0 {
        assert_eq!(
            hex(&span.trace_id),
            PRODUCER_TRACE,
            "`{}` is in the producer's trace",
            span.name
        );
    }
    let send_first = spans.one("send first");
    assert_eq!(
        hex(&send_first.parent_span_id),
        PRODUCER_SPAN,
        "the producer's span is the parent"
    );
    assert_eq!(
        spans.one("process first").parent_span_id,
        send_first.span_id
    );
    assert_eq!(
        spans.one("process second").parent_span_id,
        spans.one("send second").span_id
    );
}
