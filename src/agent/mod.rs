//! The agent side: programs that run beside an agent host and ask the broker before a tool runs.
//! The approval hooks of the agent hosts (`hook/`, one core and a file per host), the Agent Client
//! Protocol proxy (`acp/`) and the MCP gateway (`mcp/`). They are gRPC clients of the broker like
//! any agent, share one broker client (`hook::review`) and one source of bearer tokens
//! (`token_source`: a fixed token, or the identity provider's, renewed), check each outcome's
//! signed receipt before a tool runs, and fail closed.

pub mod acp;
pub mod hook;
pub mod mcp;
pub mod token_source;
