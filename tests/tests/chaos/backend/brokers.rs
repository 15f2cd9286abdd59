//! The brokers of the fault matrix, each a private instance of the case's own: a
//! `redis-server` or a three-master Redis Cluster (append-only, so a restart keeps every
//! acknowledged write), a RabbitMQ node, a tansu Kafka broker (in memory: it is cut off, never
//! restarted), and the Service Bus contract server. The host reaches every one through
//! proxies the case controls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use wharf_host::external::kafka::KafkaSettings;
use wharf_host::external::rabbitmq::{Names, RabbitSettings};
use wharf_host::external::redis::Keys;
use wharf_tests::kafka::{KafkaNode, KafkaReader, TEST_PROPERTIES};
use wharf_tests::proxy::TcpProxy;
use wharf_tests::rabbit_node::RabbitNode;
use wharf_tests::rabbitmq_queue_counts;
use wharf_tests::redis_nodes::{RedisCluster, RedisNode};
use wharf_tests::servicebus::ContractServer;
use wharf_tests::unique_prefix;

use super::Backend;

const SB_KEY_NAME: &str = "RootManageSharedAccessKey";
const SB_KEY: &str = "Y2hhb3Mta2V5";
/// The Service Bus topic of `work` (default prefix).
const SB_TOPIC: &str = "nexus.work";
/// The Service Bus topic of `replies`, for cases whose follow-ups go into the broker.
const SB_REPLIES_TOPIC: &str = "nexus.replies";

/// A broker under test.
pub enum Broker {
    /// One server or a cluster, and `work`'s keys.
    Redis {
        keys: Keys,
        url: String,
        node: Option<RedisNode>,
        cluster: Option<RedisCluster>,
    },
    RabbitMq {
        node: RabbitNode,
        names: Names,
    },
    Kafka {
        node: KafkaNode,
        reader: Arc<KafkaReader>,
        settings: KafkaSettings,
    },
    ServiceBus {
        server: ContractServer,
    },
}

impl Broker {
    /// Start the broker of `backend`; returns it, the body of `[providers.main]` and the
    /// proxy the host reaches it through (unless the broker keeps its own, see
    /// [`Broker::own_proxies`]).
    pub async fn start(backend: Backend) -> (Broker, String, Option<TcpProxy>) {
        let prefix = unique_prefix("chaos");
        let redis = |url: &str| {
            format!(
                "type = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\npromote_interval = \"100ms\"\n"
            )
        };
        match backend {
            Backend::Redis => {
                let node = RedisNode::standalone();
                let proxy = TcpProxy::start(node.port).await;
                let provider = redis(&format!("redis://127.0.0.1:{}", proxy.port()));
                let broker = Broker::Redis {
                    keys: Keys::new(&prefix, "work"),
                    url: node.url(),
                    node: Some(node),
                    cluster: None,
                };
                (broker, provider, Some(proxy))
            }
            Backend::RedisCluster => {
                // Each node announces its proxy: the host reaches every node through one.
                let cluster = RedisCluster::start_behind_proxies(3).await;
                let provider = redis(&cluster.url());
                let broker = Broker::Redis {
                    keys: Keys::new(&prefix, "work"),
                    url: cluster.url(),
                    node: None,
                    cluster: Some(cluster),
                };
                (broker, provider, None)
            }
            Backend::RabbitMq => {
                let node = RabbitNode::start().await.expect("a private RabbitMQ node");
                let proxy = TcpProxy::start(node.amqp_port()).await;
                let prefix = prefix.replace(':', ".");
                let provider = format!(
                    "type = \"rabbitmq\"\nurl = \"amqp://guest:guest@127.0.0.1:{}/%2f\"\nexchange_prefix = \"{prefix}\"\nqueue_prefix = \"{prefix}\"\n",
                    proxy.port()
                );
                let names = RabbitSettings {
                    exchange_prefix: prefix.clone(),
                    queue_prefix: prefix,
                    ..RabbitSettings::new(node.amqp_url())
                }
                .names("work");
                (Broker::RabbitMq { node, names }, provider, Some(proxy))
            }
            Backend::Kafka => {
                let node = KafkaNode::start().await;
                let prefix = prefix.replace(':', ".");
                let mut settings = KafkaSettings::new(node.brokers());
                settings.topic_prefix = prefix.clone();
                settings.processing_group = format!("{prefix}processing");
                settings.readiness_group = format!("{prefix}readiness");
                let provider = format!(
                    "type = \"kafka\"\nbrokers = \"{}\"\ntopic_prefix = \"{}\"\nprocessing_group = \"{}\"\nreadiness_group = \"{}\"\npartitions = 2\n{TEST_PROPERTIES}\n",
                    node.brokers(),
                    settings.topic_prefix,
                    settings.processing_group,
                    settings.readiness_group
                );
                let reader = Arc::new(KafkaReader::new(&node.brokers()));
                let broker = Broker::Kafka {
                    node,
                    reader,
                    settings,
                };
                (broker, provider, None)
            }
            Backend::ServiceBus => {
                let server = ContractServer::start(SB_KEY_NAME, SB_KEY).await;
                server.set_lock_duration(Duration::from_secs(4));
                server.create_topic(SB_TOPIC, &["processing", "readiness"]);
                server.create_topic(SB_REPLIES_TOPIC, &["processing", "readiness"]);
                let proxy = TcpProxy::start(server.port()).await;
                let provider = format!(
                    "type = \"servicebus\"\nconnection_string = \"Endpoint=sb://chaos.servicebus.windows.net/;SharedAccessKeyName={SB_KEY_NAME};SharedAccessKey={SB_KEY}\"\nendpoint_override = \"http://127.0.0.1:{}\"\n",
                    proxy.port()
                );
                (Broker::ServiceBus { server }, provider, Some(proxy))
            }
            Backend::Sqlite | Backend::Postgres => unreachable!("not a broker"),
        }
    }

    /// The proxies a broker keeps in front of itself, announced as its addresses (Kafka's
    /// one, a cluster's one per node).
    pub fn own_proxies(&self) -> Vec<&TcpProxy> {
        match self {
            Broker::Kafka { node, .. } => vec![node.proxy()],
            Broker::Redis {
                cluster: Some(cluster),
                ..
            } => cluster.proxies.iter().collect(),
            _ => Vec::new(),
        }
    }

    /// Whether nothing of `work` is left in the broker (ready, leased or unacknowledged).
    pub async fn drained(&self) -> bool {
        match self {
            Broker::Redis { keys, url, .. } => {
                let target = wharf_host::redis_client::RedisTarget::parse(url).unwrap();
                let Ok(mut conn) = target.connect(Duration::from_secs(5)).await else {
                    return false;
                };
                let ready: redis::RedisResult<u64> = conn.zcard(&keys.ready).await;
                let leased: redis::RedisResult<u64> = conn.zcard(&keys.leases).await;
                ready == Ok(0) && leased == Ok(0)
            }
            Broker::RabbitMq { node, names } => {
                rabbitmq_queue_counts(Some(node.node_name()), &names.processing).await == (0, 0)
            }
            Broker::Kafka {
                reader, settings, ..
            } => {
                let (reader, group, topic) = (
                    reader.clone(),
                    settings.processing_group.clone(),
                    settings.topic("work"),
                );
                tokio::task::spawn_blocking(move || reader.lag(&group, &topic) == 0)
                    .await
                    .unwrap()
            }
            Broker::ServiceBus { server } => server.counts(SB_TOPIC, "processing") == (0, 0, 0),
        }
    }

    /// SIGKILL the broker (for a cluster, the node serving `work`'s slot), call `during`
    /// for `down`, then start it again on its data.
    pub async fn restart(&mut self, down: Duration, mut during: impl AsyncFnMut()) {
        let until = Instant::now() + down;
        match self {
            Broker::Redis {
                keys,
                node,
                cluster,
                ..
            } => {
                let node = match (node, cluster.as_mut()) {
                    (Some(node), _) => node,
                    (None, Some(cluster)) => {
                        let owner = cluster.owner_of(&keys.ready);
                        &mut cluster.nodes[owner]
                    }
                    (None, None) => unreachable!("a Redis broker has a node or a cluster"),
                };
                node.kill();
                while Instant::now() < until {
                    during().await;
                }
                node.start();
                if let Some(cluster) = cluster {
                    tokio::task::block_in_place(|| cluster.wait_healthy());
                }
            }
            Broker::RabbitMq { node, .. } => {
                node.kill().await.expect("killing the RabbitMQ node");
                while Instant::now() < until {
                    during().await;
                }
                node.start_node()
                    .await
                    .expect("the RabbitMQ node starts again");
            }
            Broker::Kafka { .. } | Broker::ServiceBus { .. } => {
                panic!("this broker keeps its data in memory: it is cut off, not restarted")
            }
        }
    }
}
