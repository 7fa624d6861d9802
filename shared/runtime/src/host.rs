//! This host's name, which instances name themselves after in leases and
//! ownership claims.

/// `HOSTNAME` (Kubernetes sets it to the pod's name), else the kernel's host
/// name, else `skyport`.
pub fn name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "skyport".into())
}
