//! Composition of the callbacks: the change-feed processor over the status
//! store's change feed, with the notifier as its handler, signing with
//! secrets derived from the master secrets configured — or, on the embedded
//! store with none configured, the one kept in the data directory's
//! `callback-secret` (created once). Only the process that signs needs them:
//! a gateway alone holds none.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use skyport_callbacks::change_feed::{Processor, ProcessorSettings};
use skyport_callbacks::notify::{MasterSecrets, Notifier};
use skyport_runtime::config::{ConfigError, SECRET_PREFIX, Settings, StoreBackend, decode_secret};
use skyport_runtime::destination::AddressPolicy;

use crate::backends::{Backends, Store};

/// The file in the embedded data directory that holds the generated secret.
pub const SECRET_FILE: &str = "callback-secret";

/// Checks, before anything is opened, that a process that signs callbacks
/// (the worker, the all-in-one) has a master secret when they are enabled
/// on a store that keeps none (Cosmos DB).
///
/// # Errors
/// A [`ConfigError`] naming `callbacks.secrets`.
pub fn check_secrets(settings: &Settings) -> Result<(), ConfigError> {
    let none = settings.callbacks.enabled == Some(true)
        && settings.callbacks.keys().is_empty()
        && settings.store_backend() != StoreBackend::Embedded;
    if none { Err(no_secret()) } else { Ok(()) }
}

fn no_secret() -> ConfigError {
    ConfigError::new(
        "callbacks.secrets",
        "must hold a master secret where callbacks are signed (the worker, or the all-in-one) when they are enabled on Cosmos DB: no embedded store keeps one",
    )
}

/// The change-feed processor that delivers the callbacks, with the notifier
/// as its handler, when callbacks are enabled (`callbacks.enabled`; unset:
/// where there is a secret, configured or kept by the embedded store that
/// `backends` hold); run it with [`Processor::run`].
///
/// # Errors
/// A [`ConfigError`] naming `callbacks.secrets` when callbacks are enabled on
/// Cosmos DB with no secret to sign with; an error when the generated one
/// cannot be kept, or the HTTP client cannot be built.
pub fn notifier(
    settings: &Settings,
    backends: &Backends,
) -> anyhow::Result<Option<Arc<Processor>>> {
    let keys = match (&backends.store, settings.callbacks.keys()) {
        _ if settings.callbacks.enabled == Some(false) => return Ok(None),
        (_, keys) if !keys.is_empty() => keys,
        (Store::Embedded(_), _) => vec![kept_secret(&settings.embedded.data_dir)?],
        // Unset `enabled` means on where there is a secret: there is none.
        (Store::Cosmos(_), _) if settings.callbacks.enabled.is_none() => return Ok(None),
        (Store::Cosmos(_), none) => none,
    };
    let masters = MasterSecrets::new(&keys).ok_or_else(no_secret)?;
    let processor_settings = ProcessorSettings {
        only_with_field: Some(Notifier::FIELD.to_owned()),
        ..ProcessorSettings::from(&settings.change_feed)
    };
    let ports = backends.worker_ports();
    let notifier = Notifier::new(
        Arc::clone(&ports.status),
        Arc::clone(&ports.dead_letters),
        &settings.callbacks,
        AddressPolicy::new(settings.callbacks.allowed()),
        masters,
        &processor_settings.processor,
    )
    .context("cannot build the callbacks' HTTP client")?;
    Ok(Some(Processor::new(
        processor_settings,
        backends.store.changes(),
        backends.store.leases(),
        Arc::clone(&ports.dead_letters),
        Arc::new(notifier),
    )))
}

/// The secret in `data_dir`'s `callback-secret`, `None` when there is no
/// such file yet; reads only, so it may run beside the process that keeps it.
///
/// # Errors
/// When the file cannot be read or holds no secret.
pub fn read_kept_secret(data_dir: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    let path: PathBuf = data_dir.join(SECRET_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => decode_secret(text.trim()).map(Some).with_context(|| {
            format!(
                "{} does not hold a callback secret (\"{SECRET_PREFIX}\" and base64)",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The secret in `data_dir`'s `callback-secret`, created (owner-only) when missing.
fn kept_secret(data_dir: &Path) -> anyhow::Result<Vec<u8>> {
    let path: PathBuf = data_dir.join(SECRET_FILE);
    match read_kept_secret(data_dir)? {
        Some(key) => Ok(key),
        None => {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
            let text = format!("{SECRET_PREFIX}{}\n", STANDARD.encode(key));
            std::fs::create_dir_all(data_dir)
                .with_context(|| format!("cannot create {}", data_dir.display()))?;
            let mut file = create_private(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            file.write_all(text.as_bytes())
                .and_then(|()| file.sync_all())
                .with_context(|| format!("cannot write {}", path.display()))?;
            tracing::info!(path = %path.display(), "Callbacks are signed with the master secret generated in this file, or with each principal's secret derived from it (`skyport callbacks secret PRINCIPAL` prints it).");
            Ok(key.to_vec())
        }
    }
}

#[cfg(unix)]
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}
