//! The provider types Wharf knows. A provider is one module implementing [`ProviderKind`]
//! (settings and opening, [`super::kind`]) and the traits of [`super::provider`];
//! registering it is one line in [`KINDS`].

pub use super::kind::{ProviderKind, SettingsError, parse_settings};

/// Every provider type, by `type`.
pub static KINDS: &[&dyn ProviderKind] = &[
    #[cfg(feature = "redis")]
    &super::redis::RedisKind,
    #[cfg(feature = "rabbitmq")]
    &super::rabbitmq::RabbitMqKind,
    #[cfg(feature = "kafka")]
    &super::kafka::KafkaKind,
    #[cfg(feature = "servicebus")]
    &super::servicebus::ServiceBusKind,
];

/// The provider type called `name`.
pub fn find(name: &str) -> Option<&'static dyn ProviderKind> {
    KINDS.iter().copied().find(|k| k.name() == name)
}

/// The provider types this build left out (each is a Cargo feature of `wharf-host`).
pub fn left_out() -> Vec<&'static str> {
    let built = [
        ("redis", cfg!(feature = "redis")),
        ("rabbitmq", cfg!(feature = "rabbitmq")),
        ("kafka", cfg!(feature = "kafka")),
        ("servicebus", cfg!(feature = "servicebus")),
    ];
    built
        .into_iter()
        .filter_map(|(name, built)| (!built).then_some(name))
        .collect()
}

/// The names of every provider type.
pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name()).collect()
}
