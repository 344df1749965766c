//! Where people and programs reach the broker: the gRPC services (`grpc/`), the approval web page
//! served beside them (`inbox/`) and Slack's signed clicks (`slack/`). Every surface reads and
//! writes through the broker facade, never the store; who may do what is decided at the door
//! (`crate::door`) and in the one gate (`crate::domain::policy::gate`).

pub mod grpc;
pub mod inbox;
pub mod slack;
