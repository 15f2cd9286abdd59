//! temporary probe
fn main() {
    let t = std::time::Instant::now();
    let r = wharf_tests::kafka::KafkaReader::new("127.0.0.1:9092"); let p = r.partitions("probe-21986");
    println!("partitions {p:?} {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let c = r.committed("probe-21986-g", "probe-21986");
    println!("committed {c:?} {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let e = r.ends("probe-21986");
    println!("ends {e:?} {:?}", t.elapsed()); let t = std::time::Instant::now(); let e = r.ends("probe-21986"); println!("ends again {e:?} {:?}", t.elapsed());
}
