//! `[telemetry]`: OpenTelemetry traces exported over OTLP/HTTP (protobuf). Off by default.
//! A key the file leaves unset is taken from the standard `OTEL_*` variables, then from the
//! default; the file wins where it says something.

use std::time::Duration;

use serde::Deserialize;

/// Where spans go when neither the file nor the environment says.
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

/// How long one export may take when the environment does not say (the OTLP default).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// `[telemetry]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Export traces (default: on when `OTEL_TRACES_EXPORTER=otlp`, off otherwise).
    pub traces: Option<bool>,
    /// The OTLP/HTTP base URL; spans go to `ENDPOINT/v1/traces` (default:
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as the full URL, `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// then `http://localhost:4318`).
    pub endpoint: Option<String>,
    /// The `service.name` of every span (default: `OTEL_SERVICE_NAME`, then `wharf`).
    pub service_name: Option<String>,
    /// The share of new traces recorded, 0.0 to 1.0; a message whose producer's trace was
    /// sampled (or not) follows that decision (default: `OTEL_TRACES_SAMPLER` and
    /// `OTEL_TRACES_SAMPLER_ARG`, then 1.0).
    pub sample_ratio: Option<f64>,
    /// Finished spans waiting for export at most; beyond it spans are dropped and counted in
    /// `wharf_trace_spans_dropped_total` (default 8192).
    pub max_queued_spans: Option<usize>,
}

/// How new traces and traces with a parent are sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// The share of new traces recorded.
    pub ratio: f64,
    /// Whether a remote parent's decision is followed (the `parentbased_*` samplers).
    pub parent_based: bool,
}

/// `[telemetry]` with every default and variable applied: what the host runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    /// The URL spans are posted to (ends in `/v1/traces`).
    pub traces_url: String,
    /// `service.name`.
    pub service_name: String,
    /// The sampler.
    pub sampling: Sampling,
    /// Finished spans waiting for export at most.
    pub max_queued_spans: usize,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, then
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, in milliseconds; default 10 s).
    pub export_timeout: Duration,
}

impl TelemetryConfig {
    /// What the host runs with, reading the `OTEL_*` variables through `env`; `Ok(None)`
    /// when traces are off. An error is the key or variable to blame and the reason.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Telemetry>, (&'static str, String)> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let on = match self.traces {
            Some(on) => on,
            None => env("OTEL_TRACES_EXPORTER")
                .is_some_and(|v| v.split(',').any(|e| e.trim().eq_ignore_ascii_case("otlp"))),
        };
        if !on {
            return Ok(None);
        }
        let traces_url = match (&self.endpoint, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            (Some(base), _) => signal_url(base),
            (None, Some(full)) => full,
            (None, None) => signal_url(
                &env("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into()),
            ),
        };
        if !(traces_url.starts_with("http://") || traces_url.starts_with("https://")) {
            let key = match self.endpoint {
                Some(_) => "telemetry.endpoint",
                None => "OTEL_EXPORTER_OTLP_ENDPOINT",
            };
            return Err((
                key,
                format!(
                    "{traces_url:?} is not an http:// or https:// URL (OTLP over HTTP, e.g. \"{DEFAULT_ENDPOINT}\")"
                ),
            ));
        }
        let sampling = match self.sample_ratio {
            Some(ratio) if (0.0..=1.0).contains(&ratio) => Sampling {
                ratio,
                parent_based: true,
            },
            Some(ratio) => {
                return Err((
                    "telemetry.sample_ratio",
                    format!(
                        "{ratio} is outside 0.0 to 1.0 (1.0 records every new trace, 0.0 none)"
                    ),
                ));
            }
            None => sampler_from_env(
                env("OTEL_TRACES_SAMPLER").as_deref(),
                env("OTEL_TRACES_SAMPLER_ARG").as_deref(),
            )?,
        };
        let max_queued_spans = self.max_queued_spans.unwrap_or(8192);
        if max_queued_spans == 0 {
            return Err((
                "telemetry.max_queued_spans",
                "0 would drop every span; set at least 1 (default 8192)".into(),
            ));
        }
        let export_timeout = export_timeout(env)?;
        Ok(Some(Telemetry {
            traces_url,
            service_name: self
                .service_name
                .clone()
                .or_else(|| env("OTEL_SERVICE_NAME"))
                .unwrap_or_else(|| "wharf".into()),
            sampling,
            max_queued_spans,
            export_timeout,
        }))
    }
}

/// The export timeout the OTLP variables set (milliseconds), or the default.
fn export_timeout(
    env: impl Fn(&str) -> Option<String>,
) -> Result<Duration, (&'static str, String)> {
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ] {
        if let Some(text) = env(name) {
            return match text.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
                _ => Err((
                    name,
                    format!("{text:?} is not a number of milliseconds above 0 (e.g. 10000)"),
                )),
            };
        }
    }
    Ok(DEFAULT_EXPORT_TIMEOUT)
}

/// `BASE/v1/traces`.
fn signal_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// The sampler `OTEL_TRACES_SAMPLER` (and its argument) names; unset: parent-based, all.
fn sampler_from_env(
    name: Option<&str>,
    arg: Option<&str>,
) -> Result<Sampling, (&'static str, String)> {
    let ratio = || -> Result<f64, (&'static str, String)> {
        match arg {
            None => Ok(1.0),
            Some(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| {
                    let reason = format!("{text:?} is not a ratio from 0.0 to 1.0");
                    ("OTEL_TRACES_SAMPLER_ARG", reason)
                }),
        }
    };
    let (ratio, parent_based) = match name.map(str::trim) {
        None | Some("parentbased_always_on") => (1.0, true),
        Some("always_on") => (1.0, false),
        Some("always_off") => (0.0, false),
        Some("parentbased_always_off") => (0.0, true),
        Some("traceidratio") => (ratio()?, false),
        Some("parentbased_traceidratio") => (ratio()?, true),
        Some(other) => {
            return Err((
                "OTEL_TRACES_SAMPLER",
                format!(
                    "{other:?} is not a sampler Wharf knows (always_on, always_off, traceidratio and their parentbased_ forms)"
                ),
            ));
        }
    };
    Ok(Sampling {
        ratio,
        parent_based,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn off_unless_the_file_or_the_exporter_variable_says_so() {
        let config = TelemetryConfig::default();
        assert_eq!(config.resolve(env(&[])).unwrap(), None);
        assert_eq!(
            config
                .resolve(env(&[("OTEL_TRACES_EXPORTER", "none")]))
                .unwrap(),
            None
        );
        let on = config
            .resolve(env(&[("OTEL_TRACES_EXPORTER", "otlp")]))
            .unwrap()
            .unwrap();
        assert_eq!(on.traces_url, "http://localhost:4318/v1/traces");
        assert_eq!(on.service_name, "wharf");
        let off = TelemetryConfig {
            traces: Some(false),
            ..Default::default()
        };
        assert_eq!(
            off.resolve(env(&[("OTEL_TRACES_EXPORTER", "otlp")]))
                .unwrap(),
            None
        );
    }

    #[test]
    fn the_file_wins_over_the_variables() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("OTEL_SERVICE_NAME", "orders"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ];
        let on = TelemetryConfig {
            traces: Some(true),
            ..Default::default()
        };
        let from_env = on.resolve(env(&vars)).unwrap().unwrap();
        assert_eq!(from_env.traces_url, "http://collector:4318/v1/traces");
        assert_eq!(from_env.service_name, "orders");
        assert_eq!(
            from_env.sampling,
            Sampling {
                ratio: 0.25,
                parent_based: true
            }
        );
        let file = TelemetryConfig {
            traces: Some(true),
            endpoint: Some("http://127.0.0.1:9999".into()),
            service_name: Some("billing".into()),
            sample_ratio: Some(0.0),
            max_queued_spans: None,
        };
        let resolved = file.resolve(env(&vars)).unwrap().unwrap();
        assert_eq!(resolved.traces_url, "http://127.0.0.1:9999/v1/traces");
        assert_eq!(resolved.service_name, "billing");
        assert_eq!(resolved.sampling.ratio, 0.0);
    }

    #[test]
    fn the_export_timeout_comes_from_the_otlp_variables() {
        let on = TelemetryConfig {
            traces: Some(true),
            ..Default::default()
        };
        let timeout =
            |vars: &[(&str, &str)]| on.resolve(env(vars)).map(|t| t.unwrap().export_timeout);
        assert_eq!(timeout(&[]).unwrap(), DEFAULT_EXPORT_TIMEOUT);
        assert_eq!(
            timeout(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "30000")]).unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            timeout(&[
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "30000"),
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
            ])
            .unwrap(),
            Duration::from_millis(2500)
        );
        for bad in ["ten", "0", "-5"] {
            let e = timeout(&[("OTEL_EXPORTER_OTLP_TIMEOUT", bad)]).unwrap_err();
            assert_eq!(e.0, "OTEL_EXPORTER_OTLP_TIMEOUT", "{e:?}");
            assert!(e.1.contains("milliseconds"), "{e:?}");
        }
    }

    #[test]
    fn bad_values_name_the_key() {
        let on = |c: TelemetryConfig| TelemetryConfig {
            traces: Some(true),
            ..c
        };
        let e = on(TelemetryConfig {
            sample_ratio: Some(1.5),
            ..Default::default()
        })
        .resolve(env(&[]))
        .unwrap_err();
        assert_eq!(e.0, "telemetry.sample_ratio", "{e:?}");
        let e = on(TelemetryConfig {
            endpoint: Some("collector:4318".into()),
            ..Default::default()
        })
        .resolve(env(&[]))
        .unwrap_err();
        assert_eq!(e.0, "telemetry.endpoint", "{e:?}");
        let e = on(TelemetryConfig::default())
            .resolve(env(&[("OTEL_TRACES_SAMPLER", "sometimes")]))
            .unwrap_err();
        assert_eq!(e.0, "OTEL_TRACES_SAMPLER", "{e:?}");
        let e = on(TelemetryConfig {
            max_queued_spans: Some(0),
            ..Default::default()
        })
        .resolve(env(&[]))
        .unwrap_err();
        assert_eq!(e.0, "telemetry.max_queued_spans", "{e:?}");
    }
}
