//! Entra ID credentials for the Azure adapters.

use std::sync::Arc;

use azure_core::credentials::TokenCredential;

/// The Entra ID credential of this environment: workload identity on
/// Kubernetes (`AZURE_FEDERATED_TOKEN_FILE`), a managed identity on Azure
/// (`IDENTITY_ENDPOINT` or `MSI_ENDPOINT`), developer tools elsewhere.
///
/// # Errors
/// When the chosen credential cannot be built from the environment.
pub fn credential() -> azure_core::Result<Arc<dyn TokenCredential>> {
    let credential: Arc<dyn TokenCredential> =
        if std::env::var_os("AZURE_FEDERATED_TOKEN_FILE").is_some() {
            azure_identity::WorkloadIdentityCredential::new(None)?
        } else if std::env::var_os("IDENTITY_ENDPOINT").is_some()
            || std::env::var_os("MSI_ENDPOINT").is_some()
        {
            azure_identity::ManagedIdentityCredential::new(None)?
        } else {
            azure_identity::DeveloperToolsCredential::new(None)?
        };
    Ok(credential)
}
