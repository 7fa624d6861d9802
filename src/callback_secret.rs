//! `skyport callbacks secret PRINCIPAL`: the secret a principal's callback
//! receivers verify with, derived from each master secret (newest first, one
//! `whsec_…` a line on stdout and nothing else there) where the masters are,
//! for the operator to hand over out of band. The settings load as every
//! Skyport process loads them (`--config`, `--set`, `SKYPORT__…`); on the
//! embedded store with no `callbacks.secrets`, the master is the secret the
//! store keeps in its data directory, only read, so the command may run
//! beside the process that keeps it.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use secrecy::ExposeSecret;
use skyport_callbacks::notify::MasterSecrets;
use skyport_runtime::config::{Cli, ConfigError, EXIT_CONFIG, Settings, StoreBackend};

use crate::callbacks::{SECRET_FILE, read_kept_secret};

/// How the command names itself in its messages.
const NAME: &str = "skyport callbacks secret";

/// `skyport callbacks`' flags.
#[derive(Debug, Parser)]
#[command(
    name = "skyport callbacks",
    bin_name = "skyport callbacks",
    about = "The callbacks' signing secrets, for the operator who hands them to receivers."
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Prints the secret that signs PRINCIPAL's callbacks under each master
    /// secret (`callbacks.secrets`, newest first), one `whsec_…` a line.
    Secret {
        /// Who makes the deliveries: an API key's name
        /// (`gateway.auth.api_keys.NAME`) or a bearer token's subject (`sub`).
        principal: String,
        #[command(flatten)]
        settings: Cli,
    },
}

/// `skyport callbacks ARGS…` (`args` starts with the subcommand's name).
/// Exits 64 on a bad flag, a blank principal, a bad setting or no master
/// secret, naming it; 1 when the kept secret cannot be read.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let Command::Secret {
        principal,
        settings,
    } = args.command;
    if principal.trim().is_empty() {
        eprintln!(
            "{NAME}: PRINCIPAL: must name a principal (an API key's name or a token's subject), not be blank"
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let settings = match Settings::load(&settings) {
        Ok(settings) => settings,
        Err(errors) => {
            for e in errors.0 {
                eprintln!("{NAME}: configuration error: {e}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let masters = match masters(&settings) {
        Ok(masters) => masters,
        Err(e) => {
            if let Some(config) = e.downcast_ref::<ConfigError>() {
                eprintln!("{NAME}: configuration error: {config}");
                return ExitCode::from(EXIT_CONFIG);
            }
            eprintln!("{NAME}: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if !settings.auth_enabled() {
        eprintln!(
            "{NAME}: note: auth is off here (gateway.auth.enabled), so deliveries have no principal and the master secrets sign their callbacks"
        );
    }
    let mut out = std::io::stdout().lock();
    for secret in masters.principal_secrets(&principal) {
        if let Err(e) = writeln!(out, "{}", secret.expose_secret()) {
            eprintln!("{NAME}: cannot write to stdout: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// The master secrets: `callbacks.secrets`, else on the embedded store the
/// one it keeps.
fn masters(settings: &Settings) -> anyhow::Result<MasterSecrets> {
    let mut keys = settings.callbacks.keys();
    let embedded = settings.store_backend() == StoreBackend::Embedded;
    if keys.is_empty() && embedded {
        keys.extend(read_kept_secret(&settings.embedded.data_dir)?);
    }
    let missing = if embedded {
        format!(
            "holds no master secret, and {} has no {SECRET_FILE} (the first start on it writes one)",
            settings.embedded.data_dir.display()
        )
    } else {
        "holds no master secret (the secrets the worker signs callbacks with)".to_owned()
    };
    MasterSecrets::new(&keys).ok_or_else(|| ConfigError::new("callbacks.secrets", missing).into())
}
