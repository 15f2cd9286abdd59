//! `${VAR}` and `${VAR:-default}` in string values of the configuration. `$${` is a literal
//! `${`. An unset variable without a default is an error naming the variable.

/// Why a value could not be interpolated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InterpolateError {
    /// `${VAR}` where VAR is not set and no default is given.
    #[error("environment variable `{0}` is not set (write `${{{0}:-default}}` to give a default)")]
    Unset(String),
    /// `${` without a closing `}`.
    #[error("`${{` without a closing `}}`")]
    Unclosed,
    /// `${}` or a name with characters other than letters, digits and `_`.
    #[error("`{0}` is not a valid environment variable name")]
    BadName(String),
}

/// Expand variables in `input`, reading them with `lookup`.
pub fn interpolate(
    input: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, InterpolateError> {
    if !input.contains('$') {
        return Ok(input.to_string());
    }
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let end = tail.find('}').ok_or(InterpolateError::Unclosed)?;
            let expr = &tail[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (expr, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(InterpolateError::BadName(name.to_string()));
            }
            match (lookup(name).filter(|v| !v.is_empty()), default) {
                (Some(value), _) => out.push_str(&value),
                (None, Some(d)) => out.push_str(d),
                (None, None) => return Err(InterpolateError::Unset(name.to_string())),
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("db.local".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands_set_variables_and_defaults() {
        assert_eq!(
            interpolate("pg://${HOST}/x", &env).unwrap(),
            "pg://db.local/x"
        );
        assert_eq!(interpolate("${NOPE:-fallback}", &env).unwrap(), "fallback");
        assert_eq!(interpolate("${EMPTY:-d}", &env).unwrap(), "d");
        assert_eq!(interpolate("${HOST:-d}", &env).unwrap(), "db.local");
        assert_eq!(
            interpolate("cost $5 $${HOST}", &env).unwrap(),
            "cost $5 ${HOST}"
        );
    }

    #[test]
    fn reports_unset_unclosed_and_bad_names() {
        assert_eq!(
            interpolate("${NOPE}", &env),
            Err(InterpolateError::Unset("NOPE".into()))
        );
        assert_eq!(interpolate("${HOST", &env), Err(InterpolateError::Unclosed));
        assert_eq!(
            interpolate("${A-B}", &env),
            Err(InterpolateError::BadName("A-B".into()))
        );
    }
}
