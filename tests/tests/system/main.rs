//! The tests that cross crates, in one binary (one link of the whole system
//! instead of one per file), a module per feature. Each runs the system
//! in-process on 127.0.0.1 port 0 over a temporary directory, or a tool
//! against it, and stops what it started.

mod alerts;
mod auth;
mod bad_input;
mod batch;
mod browser;
mod callbacks;
mod cancellation;
mod change_feed;
mod cosmos;
mod dependencies;
mod disk_faults;
mod encodings;
mod end_to_end;
mod eventhubs;
mod eventhubs_broker;
#[cfg(feature = "live")]
mod eventhubs_live;
mod faults;
mod fuzz;
mod helm_chart;
mod idempotency;
mod images;
mod kafka;
mod kafka_entra;
#[cfg(feature = "live")]
mod kafka_live;
mod keda;
mod lanes;
mod listing;
mod load_shedding;
mod long_running;
mod markdown_links;
mod monitors;
mod native_libraries;
mod openapi_clients;
mod plan;
mod post_wait;
mod quotas;
mod redrive;
mod reschedule;
mod retention;
mod rolling_upgrade;
mod scraped;
mod slow_clients;
mod stream_contract;
mod structure;
mod tenancy;
mod throughput_control;
mod timers;
mod waiting;
