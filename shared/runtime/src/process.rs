//! The process runner: what every Skyport binary's `main` is. Flags and
//! settings → telemetry → signals → the binary's own work until the shutdown
//! signal → spans flushed → exit code.
//!
//! Exit codes: 0 after a clean stop (or `--help`), 64 (`EX_USAGE`) when a
//! flag, a setting or an `OTEL_*` variable is wrong — the message names it —
//! and 1 when the work failed.

use std::future::Future;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use tokio_util::sync::CancellationToken;

use crate::config::{Cli, ConfigError, ConfigErrors, EXIT_CONFIG, Settings};
use crate::shutdown::cancel_on_signal;
use crate::telemetry::Telemetry;

/// A Skyport binary: its name, what it does, and how its flags differ from the others'.
#[derive(Debug, Clone, Copy)]
pub struct Binary {
    name: &'static str,
    about: &'static str,
    listen_key: &'static str,
    defaults: &'static [(&'static str, &'static str)],
}

impl Binary {
    /// A binary whose `--listen` sets `gateway.listen`.
    pub const fn new(name: &'static str, about: &'static str) -> Self {
        Self {
            name,
            about,
            listen_key: "gateway.listen",
            defaults: &[],
        }
    }

    /// `--listen` sets `key` instead.
    #[must_use]
    pub const fn listening_on(mut self, key: &'static str) -> Self {
        self.listen_key = key;
        self
    }

    /// Defaults of this binary's that differ from the settings' own, as (key, value).
    #[must_use]
    pub const fn with_defaults(
        mut self,
        defaults: &'static [(&'static str, &'static str)],
    ) -> Self {
        self.defaults = defaults;
        self
    }

    /// Runs `work` with the settings and the root shutdown token (cancelled by
    /// SIGTERM or SIGINT) on a multi-threaded runtime, and turns its end into
    /// the process's exit code.
    pub fn run<F, Fut>(self, work: F) -> ExitCode
    where
        F: FnOnce(Settings, CancellationToken) -> Fut,
        Fut: Future<Output = anyhow::Result<()>>,
    {
        let settings = match self.settings() {
            Ok(settings) => settings,
            Err(code) => return code,
        };
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("{}: cannot start the async runtime: {e}", self.name);
                return ExitCode::FAILURE;
            }
        };
        runtime.block_on(async {
            let telemetry = match Telemetry::init(settings.log_format(), self.name) {
                Ok(telemetry) => telemetry,
                Err(e) => {
                    eprintln!("{}: configuration error: {e}", self.name);
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            telemetry.log_panics();
            let shutdown = CancellationToken::new();
            let signals = tokio::spawn(cancel_on_signal(shutdown.clone()));
            let result = work(settings, shutdown).await;
            signals.abort();
            telemetry.shutdown().await;
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => self.report(&e),
            }
        })
    }

    /// The flags and the settings, or the exit code when they are wrong.
    fn settings(&self) -> Result<Settings, ExitCode> {
        let listen_help = format!("Shorthand for `--set {}=ADDR`.", self.listen_key);
        let command = Cli::command()
            .name(self.name)
            .about(self.about)
            .mut_arg("listen", |arg| arg.help(listen_help));
        let cli = command
            .try_get_matches()
            .and_then(|m| Cli::from_arg_matches(&m))
            .map_err(|e| {
                let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
                let _ = e.print();
                ExitCode::from(code)
            })?;
        Settings::load_for(&cli, self.listen_key, self.defaults).map_err(|errors| {
            for e in errors.0 {
                eprintln!("{}: configuration error: {e}", self.name);
            }
            ExitCode::from(EXIT_CONFIG)
        })
    }

    /// Prints why the work failed; a configuration error found on the way exits 64.
    fn report(&self, error: &anyhow::Error) -> ExitCode {
        for cause in error.chain() {
            if let Some(e) = cause.downcast_ref::<ConfigError>() {
                eprintln!("{}: configuration error: {e}", self.name);
                return ExitCode::from(EXIT_CONFIG);
            }
            if let Some(errors) = cause.downcast_ref::<ConfigErrors>() {
                for e in &errors.0 {
                    eprintln!("{}: configuration error: {e}", self.name);
                }
                return ExitCode::from(EXIT_CONFIG);
            }
        }
        eprintln!("{}: {error:#}", self.name);
        ExitCode::FAILURE
    }
}
