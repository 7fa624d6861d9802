//! Turns SIGTERM and SIGINT into the cancellation of a root token.

use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGTERM or SIGINT (Ctrl-C), or when `token` is
/// cancelled by someone else; the task that waits ends either way.
pub async fn cancel_on_signal(token: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "Cannot listen for SIGTERM; only Ctrl-C stops this process.");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = token.cancelled() => return,
        _ = tokio::signal::ctrl_c() => tracing::info!("Received SIGINT; shutting down."),
        () = terminate => tracing::info!("Received SIGTERM; shutting down."),
    }
    token.cancel();
}
