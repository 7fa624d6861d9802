//! `cargo run --release`: the whole Skyport on one machine, data under `./data`.

use skyport::App;
use skyport_shared::adapters::BackendError;
use skyport_shared::adapters::embedded::OpenError;
use skyport_shared::config::{EXIT_CONFIG, Settings};
use skyport_shared::telemetry::Telemetry;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let settings = Settings::from_args_or_exit(
        "skyport",
        "Skyport all-in-one: gateway, worker and simulated services on the embedded store.",
    );
    let telemetry = Telemetry::init_or_exit(&settings, "skyport");
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(skyport_shared::shutdown::cancel_on_signal(shutdown.clone()));
    let data_dir = settings.embedded.data_dir.clone();
    let app = match App::start(settings, shutdown.clone()).await {
        Ok(app) => app,
        Err(e) => {
            eprintln!("skyport: {e:#}");
            let config = e.chain().any(|c| {
                matches!(
                    c.downcast_ref(),
                    Some(BackendError::Embedded(OpenError::PartitionMismatch { .. }))
                )
            });
            std::process::exit(if config { EXIT_CONFIG } else { 1 });
        }
    };
    let url = format!("http://{}", app.gateway_addr);
    println!(
        "Skyport is listening on {url} (data in {}; Ctrl-C stops it)",
        data_dir.display()
    );
    println!("Simulated services: {}", app.services_url);
    println!("Try:");
    println!("  curl -si {url}/api/deliveryrequests -H 'content-type: application/json' \\");
    println!("    -d '{}'", EXAMPLE_REQUEST);
    println!("  then GET the statusUrl it answers with until the state is Scheduled.");
    let result = app.wait().await;
    signals.abort();
    telemetry.shutdown().await;
    if let Err(e) = result {
        eprintln!("skyport: {e:#}");
        std::process::exit(1);
    }
}

const EXAMPLE_REQUEST: &str = r#"{"ownerId":"owner-1","pickupLocation":"47.6423,-122.1368","pickupTime":"2030-01-01T10:00:00Z","deadline":"2030-01-01T12:00:00Z","dropoffLocation":"47.6101,-122.2015","packageInfo":{"packageId":"pkg-1","size":"Small","weight":2.5}}"#;
