//! temporary probe
#[tokio::main]
async fn main() {
    wharf_tests::kafka::kafka_produce("127.0.0.1:9092", "probe.m.export_order", Some("x"), br#"{"MessageJson":"{}","MessageId":"x","Priority":0}"#).await;
}
