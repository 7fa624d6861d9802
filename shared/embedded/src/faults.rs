//! Faults injected into the store's file layer, so that tests can see what a
//! full or failing disk does to an append or a status write (the
//! `fault-injection` feature; without it every check passes and costs
//! nothing).

/// A switch that makes the store's writes fail as a full disk does.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    #[cfg(feature = "fault-injection")]
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Faults {
    /// Fails with "no space left" while the fault is on.
    #[cfg_attr(not(feature = "fault-injection"), allow(clippy::unused_self))]
    pub(crate) fn check(&self) -> std::io::Result<()> {
        #[cfg(feature = "fault-injection")]
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left on device (injected)",
            ));
        }
        Ok(())
    }

    /// Turns the fault on (every write and sync of the log, and every commit
    /// of the database, fails) or off.
    #[cfg(feature = "fault-injection")]
    pub fn fail_writes(&self, failing: bool) {
        self.failing
            .store(failing, std::sync::atomic::Ordering::SeqCst);
    }
}
