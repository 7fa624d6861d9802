//! Where settings come from, in order of precedence: defaults, a TOML file
//! (`--config`), `SKYPORT__SECTION__KEY` environment variables, and flags
//! (`--set KEY=VALUE`, and the shorthands `--listen` and `--data-dir`).

use std::path::PathBuf;

use clap::Parser;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};

use super::Settings;
use super::checks::{ConfigError, ConfigErrors};

/// The exit code for a configuration error (`EX_USAGE` in sysexits.h).
pub const EXIT_CONFIG: u8 = 64;
/// The prefix of environment variables that set configuration keys.
pub const ENV_PREFIX: &str = "SKYPORT__";

/// Command-line flags shared by every Skyport binary.
#[derive(Debug, Default, Parser)]
pub struct Cli {
    /// TOML file with settings, in the sections of docs/configuration.md's table.
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set one key, for example `--set worker.max_in_flight=64` (repeatable; wins over everything).
    #[arg(short, long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Shorthand for `--set gateway.listen=ADDR` (the binary's own listen key).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Shorthand for `--set embedded.data_dir=DIR`.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<String>,
}

impl Settings {
    /// Loads the layers in order of precedence, `--listen` setting `gateway.listen`.
    ///
    /// # Errors
    /// [`ConfigErrors`] names every key that is missing its file, malformed or out of range.
    pub fn load(cli: &Cli) -> Result<Self, ConfigErrors> {
        Self::load_for(cli, "gateway.listen", &[])
    }

    /// Loads the layers with `defaults` (key, value) under the file, and
    /// `--listen` setting `listen_key`: what a binary other than the gateway
    /// listens with.
    ///
    /// # Errors
    /// [`ConfigErrors`] names every key that is missing its file, malformed or out of range.
    pub fn load_for(
        cli: &Cli,
        listen_key: &str,
        defaults: &[(&str, &str)],
    ) -> Result<Self, ConfigErrors> {
        let mut figment = Figment::new();
        for (key, value) in defaults {
            figment = figment.merge(Serialized::default(key, value));
        }
        if let Some(path) = &cli.config {
            if !path.is_file() {
                return Err(ConfigError::new(
                    "--config",
                    format!("{} is not a readable file", path.display()),
                )
                .into());
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(Env::prefixed(ENV_PREFIX).split("__"));
        if let Some(listen) = &cli.listen {
            figment = figment.merge(Serialized::default(listen_key, listen));
        }
        if let Some(dir) = &cli.data_dir {
            figment = figment.merge(Serialized::default("embedded.data_dir", dir));
        }
        for assignment in &cli.set {
            let Some((key, value)) = assignment.split_once('=') else {
                return Err(
                    ConfigError::new("--set", format!("`{assignment}` is not KEY=VALUE")).into(),
                );
            };
            let value: figment::value::Value = value
                .parse()
                .unwrap_or_else(|never: std::convert::Infallible| match never {});
            figment = figment.merge(Serialized::default(key.trim(), value));
        }
        Self::extract(&figment)
    }

    /// Settings from the text of a configuration file alone, over the
    /// defaults: what `--config` would give without the environment and flags.
    ///
    /// # Errors
    /// [`ConfigErrors`] names every key that is malformed or out of range.
    pub fn from_toml(text: &str) -> Result<Self, ConfigErrors> {
        Self::extract(&Figment::from(Toml::string(text)))
    }

    fn extract(figment: &Figment) -> Result<Self, ConfigErrors> {
        let settings: Self = figment
            .extract()
            .map_err(|e| ConfigErrors(e.into_iter().map(describe).collect()))?;
        settings.validate()?;
        Ok(settings)
    }
}

/// Names the key of one figment error and where its value came from.
fn describe(error: figment::Error) -> ConfigError {
    let key = if error.path.is_empty() {
        "(top level)".to_owned()
    } else {
        error.path.join(".")
    };
    let message = match &error.metadata {
        Some(source) => match &source.source {
            Some(origin) => format!("{} (from {} {origin})", error.kind, source.name),
            None => format!("{} (from {})", error.kind, source.name),
        },
        None => error.kind.to_string(),
    };
    ConfigError::new(key, message)
}
