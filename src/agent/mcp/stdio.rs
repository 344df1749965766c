//! The client's standard I/O as an MCP transport that screens every line before the library
//! sees it (see [`super::screen`]). The library's own standard I/O transport would pass a line it
//! cannot type as a catch-all custom request, answer some lines with an error carrying no id and
//! ignore others; this one hands the library only what the screen passed, and answers every
//! refused request itself with an error carrying the request's id.
//!
//! Writes are whole lines under one lock, from tasks of their own: `receive` is polled inside a
//! `select!` and may be dropped at any await, and a reply cut in half would corrupt the stream.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::screen::{self, Screened};

/// The longest line read, as the library's own transport: 16 MiB.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// A screened line-delimited JSON-RPC transport over a reader and a writer.
pub struct ScreenedIo<R, W> {
    read: BufReader<R>,
    line: Vec<u8>,
    /// Set while the rest of an over-long line is skipped.
    discarding: bool,
    write: Arc<Mutex<Option<W>>>,
    /// Refusals being written, awaited before the end of input is reported.
    replies: Vec<JoinHandle<()>>,
}

/// The client on the process's standard I/O.
pub fn stdio() -> ScreenedIo<tokio::io::Stdin, tokio::io::Stdout> {
    ScreenedIo::new(tokio::io::stdin(), tokio::io::stdout())
}

impl<R, W> ScreenedIo<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub fn new(read: R, write: W) -> Self {
        ScreenedIo {
            read: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            write: Arc::new(Mutex::new(Some(write))),
            replies: Vec::new(),
        }
    }

    /// Writes `bytes` and a newline as one line, on a task of its own.
    fn write_line(&self, mut bytes: Vec<u8>) -> JoinHandle<Result<(), std::io::Error>> {
        bytes.push(b'\n');
        let write = self.write.clone();
        tokio::spawn(async move {
            let mut write = write.lock().await;
            let Some(out) = write.as_mut() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the MCP client's output is closed",
                ));
            };
            out.write_all(&bytes).await?;
            out.flush().await
        })
    }

    fn reply(&mut self, reply: &serde_json::Value) {
        let handle = self.write_line(reply.to_string().into_bytes());
        self.replies.retain(|h| !h.is_finished());
        self.replies.push(tokio::spawn(async move {
            if let Ok(Err(error)) = handle.await {
                tracing::warn!(%error, "cannot answer a refused MCP request");
            }
        }));
    }

    /// Reads one line into `self.line` (cancellation-safe: a partial line stays buffered).
    /// `Ok(true)` for a line, `Ok(false)` at the end of input.
    async fn read_line(&mut self) -> std::io::Result<bool> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(false);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            if self.discarding {
                self.discarding = newline.is_none();
                self.read.consume(take);
                continue;
            }
            if self.line.len() + take > MAX_LINE {
                self.line.clear();
                self.discarding = newline.is_none();
                self.read.consume(take);
                let text = format!(
                    "The approval gateway refuses messages over {MAX_LINE} bytes; nothing was \
                     sent to the MCP server."
                );
                self.reply(&screen::error_reply(
                    &serde_json::Value::Null,
                    screen::INVALID_REQUEST,
                    text,
                ));
                continue;
            }
            self.line.extend_from_slice(&available[..take]);
            self.read.consume(take);
            if newline.is_some() {
                return Ok(true);
            }
        }
    }
}

impl<R, W> Transport<RoleServer> for ScreenedIo<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let written = serde_json::to_vec(&item).map(|bytes| self.write_line(bytes));
        async move {
            match written {
                Ok(handle) => handle.await.map_err(std::io::Error::other)?,
                Err(error) => Err(std::io::Error::other(error)),
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.read_line().await {
                Ok(true) => {}
                Ok(false) => {
                    for reply in std::mem::take(&mut self.replies) {
                        let _ = reply.await;
                    }
                    return None;
                }
                Err(error) => {
                    tracing::error!(%error, "cannot read from the MCP client");
                    return None;
                }
            }
            let line = std::mem::take(&mut self.line);
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match screen::screen_bytes(text) {
                Screened::Pass(message) => return Some(*message),
                Screened::Refuse(reply) => {
                    tracing::warn!(%reply, "refused a message from the MCP client");
                    self.reply(&reply);
                }
                Screened::Drop(what) => {
                    tracing::warn!("dropped {what} from the MCP client; it was not passed on");
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let mut write = self.write.lock().await;
        if let Some(out) = write.as_mut() {
            let _ = out.flush().await;
        }
        *write = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::JsonRpcMessage;
    use serde_json::{Value, json};
    use tokio::io::AsyncReadExt as _;

    #[tokio::test]
    async fn refused_lines_are_answered_with_their_id_and_only_screened_ones_are_received() {
        let input = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "write_file", "requestState": 1}})
            .to_string(),
            "{not json".to_owned(),
            String::new(),
            json!([{"jsonrpc": "2.0", "id": "b", "method": "tools/list"}]).to_string(),
            json!({"jsonrpc": "2.0", "method": "notifications/x"}).to_string(),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string(),
        ]
        .join("\n")
            + "\n";
        let (mut output, written) = tokio::io::duplex(1 << 16);
        let mut transport = ScreenedIo::new(input.as_bytes(), written);
        let Some(JsonRpcMessage::Request(request)) = transport.receive().await else {
            panic!("tools/list was not received");
        };
        assert_eq!(request.id, rmcp::model::NumberOrString::Number(2));
        assert!(transport.receive().await.is_none());
        transport.close().await.unwrap();
        drop(transport);
        let mut text = String::new();
        output.read_to_string(&mut text).await.unwrap();
        let replies: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        let mut ids: Vec<String> = replies
            .iter()
            .map(|r| match r {
                Value::Array(batch) => format!("batch {}", batch[0]["id"]),
                one => format!("{} {}", one["id"], one["error"]["code"]),
            })
            .collect();
        ids.sort();
        assert_eq!(ids, ["1 -32602", "batch \"b\"", "null -32700"], "{text}");
    }
}
