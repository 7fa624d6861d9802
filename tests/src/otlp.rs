//! An OTLP/gRPC trace receiver for tests: the `opentelemetry-proto` crate's
//! `TraceService` on 127.0.0.1:0, keeping every export it receives until the
//! test stops it.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Default)]
struct Exports(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Exports {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running receiver; point `OTEL_EXPORTER_OTLP_ENDPOINT` at [`Self::endpoint`].
#[derive(Debug)]
pub struct OtlpReceiver {
    pub endpoint: String,
    exports: Exports,
    stop: CancellationToken,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let exports = Exports::default();
        let stop = CancellationToken::new();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(exports.clone()))
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    stop.clone().cancelled_owned(),
                ),
        );
        Self {
            endpoint,
            exports,
            stop,
            server,
        }
    }

    /// Stops serving; returns every export received, in order.
    pub async fn stop(self) -> Vec<ExportTraceServiceRequest> {
        self.stop.cancel();
        self.server.await.unwrap().unwrap();
        std::mem::take(&mut *self.exports.0.lock().unwrap())
    }
}
