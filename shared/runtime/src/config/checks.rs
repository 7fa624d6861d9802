//! Configuration errors, named by their key, and the collector every section
//! reports into, so that a start that fails names every bad key at once.

/// A setting that cannot be used, named by its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Every configuration error of one start, in the order the keys were checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl From<ConfigError> for ConfigErrors {
    fn from(error: ConfigError) -> Self {
        Self(vec![error])
    }
}

/// Collects the errors of the keys under one section (`gateway`, `gateway.auth`).
#[derive(Debug)]
pub struct Checks<'a> {
    section: String,
    errors: &'a mut Vec<ConfigError>,
}

impl<'a> Checks<'a> {
    /// Checks of the top-level keys, collected into `errors`.
    pub fn new(errors: &'a mut Vec<ConfigError>) -> Self {
        Self {
            section: String::new(),
            errors,
        }
    }

    /// The checks of a subsection, such as `auth` inside `gateway`.
    pub fn section(&mut self, name: &str) -> Checks<'_> {
        Checks {
            section: self.key(name),
            errors: self.errors,
        }
    }

    /// The full name of `key` in this section.
    pub fn key(&self, key: &str) -> String {
        match (self.section.is_empty(), key.is_empty()) {
            (true, _) => key.to_owned(),
            (false, true) => self.section.clone(),
            (false, false) => format!("{}.{key}", self.section),
        }
    }

    /// Records `message` against `key` unless `ok`; returns `ok`.
    pub fn check(&mut self, ok: bool, key: &str, message: impl Into<String>) -> bool {
        if !ok {
            self.fail(key, message);
        }
        ok
    }

    /// Records `message` against `key`.
    pub fn fail(&mut self, key: &str, message: impl Into<String>) {
        let key = self.key(key);
        self.errors.push(ConfigError::new(key, message));
    }

    /// `value` must be at least `min`.
    pub fn at_least<T: PartialOrd + std::fmt::Display>(&mut self, value: T, min: T, key: &str) {
        self.check(value >= min, key, format!("must be at least {min}"));
    }

    /// A URL setting must be http or https.
    pub fn http_url(&mut self, url: Option<&url::Url>, key: &str) {
        if let Some(url) = url {
            self.check(
                matches!(url.scheme(), "http" | "https"),
                key,
                "must be an http or https URL",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_prefixes_its_keys_and_collects_every_error() {
        let mut errors = Vec::new();
        let mut checks = Checks::new(&mut errors);
        let mut gateway = checks.section("gateway");
        gateway.at_least(0, 1, "max_in_flight");
        gateway.section("auth").fail("", "is wrong");
        assert!(checks.check(true, "profile", "fine"));
        checks.fail("profile", "is wrong too");
        let keys: Vec<_> = errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["gateway.max_in_flight", "gateway.auth", "profile"]);
        assert_eq!(errors[0].message, "must be at least 1");
    }
}
