//! temporary probe
fn main() {
    let g = std::env::args().nth(1).unwrap();
    let c: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new().set("bootstrap.servers", "127.0.0.1:9092").create().unwrap();
    use rdkafka::consumer::Consumer;
    let l = c.fetch_group_list(Some(&g), std::time::Duration::from_secs(5)).unwrap();
    for g in l.groups() { println!("direct: {} {} {} {:?}", g.name(), g.state(), g.members().len(), g.members().iter().map(|m| (m.client_id().to_string(), m.assignment().map(|a| a.to_vec()))).collect::<Vec<_>>()); }
    let md = c.fetch_metadata(Some("probe.m.export_order"), std::time::Duration::from_secs(5)).unwrap();
    for t in md.topics() { println!("topic {} parts {:?}", t.name(), t.partitions().iter().map(|p| (p.id(), p.leader())).collect::<Vec<_>>()); }
}
