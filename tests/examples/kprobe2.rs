//! temporary probe
use std::time::Duration;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
fn members(g: &str) -> String {
    let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", "127.0.0.1:9092").create().unwrap();
    match c.fetch_group_list(Some(g), Duration::from_secs(5)) { Ok(l) => l.groups().iter().map(|g| format!("{} {} {}", g.name(), g.state(), g.members().len())).collect::<Vec<_>>().join(";"), Err(e) => e.to_string() }
}
fn main() {
    let topic = "probe-21986".to_string();
    let g = format!("{topic}-g{}", std::process::id());
    let p: BaseConsumer = ClientConfig::new().set("bootstrap.servers", "127.0.0.1:9092").create().unwrap();
    let _ = p.fetch_metadata(Some(&topic), Duration::from_secs(5));
    let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", "127.0.0.1:9092").set("group.id", &g).set("session.timeout.ms", "6000").set("heartbeat.interval.ms", "1000").create().unwrap();
    c.subscribe(&[&topic]).unwrap();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(5) { c.poll(Duration::from_millis(100)); }
    println!("joined: {:?} members {}", c.assignment(), members(&g));
    drop(c);
    println!("after close: {}", members(&g));
    std::thread::sleep(Duration::from_secs(8));
    println!("after 8s: {}", members(&g));
}
