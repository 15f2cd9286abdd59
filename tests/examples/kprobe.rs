//! temporary probe
use std::time::Duration;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

#[tokio::main]
async fn main() {
    let brokers = "127.0.0.1:9092";
    let topic = format!("probe-{}", std::process::id());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let r = admin.create_topics(&[NewTopic::new(&topic, -1, TopicReplication::Fixed(-1))], &AdminOptions::new()).await;
    println!("create -1/-1: {r:?}");
    let r = admin.create_topics(&[NewTopic::new(&topic, 3, TopicReplication::Fixed(1))], &AdminOptions::new()).await;
    println!("create 3/1: {r:?}");
    let r = admin.create_topics(&[NewTopic::new(&topic, 3, TopicReplication::Fixed(1))], &AdminOptions::new()).await;
    println!("create again: {r:?}");
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", brokers).set("acks", "all").set("enable.idempotence", "true").create().unwrap();
    let t0 = std::time::Instant::now();
    let mut futs = Vec::new();
    for i in 0..10 {
        let key = format!("k{i}");
        let payload = format!("v{i}");
        futs.push(producer.send_result(FutureRecord::to(&topic).key(&key).payload(&payload)).unwrap());
    }
    for f in futs { let r = f.await.unwrap(); println!("sent {:?}", r.map(|d| (d.partition, d.offset)).map_err(|e| e.0)); }
    println!("produce took {:?}", t0.elapsed());
    for p in 0..3 { println!("watermarks {p}: {:?}", producer.client().fetch_watermarks(&topic, p, Duration::from_secs(5))); }
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).set("group.id", format!("{topic}-g")).set("enable.auto.commit", "false").set("auto.offset.reset", "earliest").set("session.timeout.ms", "6000").set("heartbeat.interval.ms", "1000").create().unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let t0 = std::time::Instant::now();
    let mut got = 0;
    while got < 10 && t0.elapsed() < Duration::from_secs(30) {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) { let m = m.unwrap(); got += 1; println!("got p{} o{} ts {:?} key {:?} after {:?}", m.partition(), m.offset(), m.timestamp(), m.key().map(|k| String::from_utf8_lossy(k).to_string()), t0.elapsed()); }
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(1)).unwrap();
    tpl.find_partition(&topic, 0).unwrap().set_metadata("wharf:mark=7");
    println!("commit: {:?}", consumer.commit(&tpl, CommitMode::Sync));
    let c = consumer.committed(Duration::from_secs(5)).unwrap();
    for e in c.elements() { println!("committed {} {} {:?} meta {:?}", e.topic(), e.partition(), e.offset(), e.metadata()); }
    let gl = consumer.fetch_group_list(Some(&format!("{topic}-g")), Duration::from_secs(5));
    match gl { Ok(gl) => for g in gl.groups() { println!("group {} state {} members {}", g.name(), g.state(), g.members().len()); }, Err(e) => println!("group list err {e}") }
    // another consumer reading committed offsets of the group without joining
    let reader: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).set("group.id", format!("{topic}-g")).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 { tpl.add_partition(&topic, p); }
    let c = reader.committed_offsets(tpl, Duration::from_secs(5)).unwrap();
    for e in c.elements() { println!("reader committed {} {:?} meta {:?}", e.partition(), e.offset(), e.metadata()); }
    let marks: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).set("group.id", format!("{topic}-marks")).set("enable.auto.commit", "false").create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 1, Offset::Offset(42)).unwrap();
    let t0 = std::time::Instant::now();
    println!("standalone commit: {:?} in {:?}", marks.commit(&tpl, CommitMode::Sync), t0.elapsed());
    let t0 = std::time::Instant::now();
    println!("standalone commit 2: {:?} in {:?}", marks.commit(&tpl, CommitMode::Sync), t0.elapsed());
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 { tpl.add_partition(&topic, p); }
    let c = marks.committed_offsets(tpl, Duration::from_secs(5)).unwrap();
    for e in c.elements() { println!("marks committed {} {:?}", e.partition(), e.offset()); }
}
