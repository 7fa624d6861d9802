//! The resolver of callback URLs' names: the system's answer, less every
//! address the [`AddressPolicy`] refuses, so that a connection goes only to
//! addresses that passed and a name cannot change its answer between the
//! check and the connection.

use std::net::SocketAddr;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use skyport_runtime::destination::AddressPolicy;

/// Resolves names as the system does and keeps only the addresses the policy
/// permits, so that the connection can go nowhere else.
#[derive(Debug)]
pub(crate) struct GuardedResolver {
    pub(crate) policy: AddressPolicy,
}

/// A name every address of which the policy refuses.
#[derive(Debug, thiserror::Error)]
#[error("{name} resolves only to addresses callbacks may not reach: {reasons}")]
pub(crate) struct RefusedName {
    pub(crate) name: String,
    pub(crate) reasons: String,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let mut reasons: Vec<String> = Vec::new();
            let mut permitted = Vec::new();
            for address in resolved {
                match policy.refusal(address.ip()) {
                    None => permitted.push(address),
                    Some(kind) => {
                        let reason = format!("{} is {kind}", address.ip());
                        if !reasons.contains(&reason) {
                            reasons.push(reason);
                        }
                    }
                }
            }
            if permitted.is_empty() && !reasons.is_empty() {
                return Err(RefusedName {
                    name: name.as_str().to_owned(),
                    reasons: reasons.join(", "),
                }
                .into());
            }
            let addresses: Addrs = Box::new(permitted.into_iter());
            Ok(addresses)
        })
    }
}
