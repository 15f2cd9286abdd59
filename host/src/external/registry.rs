//! The provider types Wharf knows. A provider is one module implementing [`ProviderKind`]
//! (settings and opening, [`super::kind`]) and the traits of [`super::provider`];
//! registering it is one line in [`KINDS`].

pub use super::kind::{ProviderKind, SettingsError, parse_settings};

/// Every provider type, by `type`.
pub static KINDS: &[&dyn ProviderKind] = &[
    &super::redis::RedisKind,
    &super::rabbitmq::RabbitMqKind,
    &super::kafka::KafkaKind,
    &super::servicebus::ServiceBusKind,
];

/// The provider type called `name`.
pub fn find(name: &str) -> Option<&'static dyn ProviderKind> {
    KINDS.iter().copied().find(|k| k.name() == name)
}

/// The names of every provider type.
pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name()).collect()
}
