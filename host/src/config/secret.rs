//! Secrets in the configuration: [`Secret`] values that no printed form shows, and
//! [`redacted_url`] for connection strings quoted in messages.

use serde::Deserialize;

/// A value kept out of every printed form.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wrap a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// `url` with the password of its user information replaced by `***`
/// (`postgres://app:***@db/wharf`), for error messages and logs.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // The user information ends at the last `@` (a password may hold `/`, `?` or `#`).
    match rest.rsplit_once('@') {
        Some((userinfo, host)) if !userinfo.contains('/') || userinfo.contains(':') => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}")
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_the_rest_kept() {
        assert_eq!(
            redacted_url("postgres://app:p%40ss@db.internal:5432/wharf?sslmode=require"),
            "postgres://app:***@db.internal:5432/wharf?sslmode=require"
        );
        assert_eq!(
            redacted_url("redis://:hunter2@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(
            redacted_url("postgres://app@db/wharf"),
            "postgres://app@db/wharf"
        );
        assert_eq!(redacted_url("sqlite://wharf.db"), "sqlite://wharf.db");
        assert_eq!(
            redacted_url("amqp://app:pa/ss?#@broker:5672/%2f"),
            "amqp://app:***@broker:5672/%2f"
        );
        assert_eq!(format!("{:?}", Secret::new("x")), "Secret(***)");
    }
}
