//! What the broker tells its operators about itself: metrics (`meters`), one log line per outcome
//! (`telemetry`) and OTLP traces (`traces`).

pub mod meters;
pub mod telemetry;
pub mod traces;
