//! The flood guard on one client connection: it reads the HTTP/2 frame headers passing in each
//! direction (after TLS, so it sees frames, not ciphertext) and closes the connection with a
//! GOAWAY `ENHANCE_YOUR_CALM` when the client sends PING or SETTINGS frames faster than
//! `--max-control-frames-per-second`. h2 answers every PING and SETTINGS frame and has no such
//! limit of its own, so without this a client can keep a core busy on acknowledgements alone.
//!
//! As gRPC's own keepalive enforcement does, pings that follow data the broker sent do not count:
//! gRPC clients measure bandwidth with a ping per window of data they receive. The guard never
//! changes a byte that passes; it only ends the connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The bytes of an HTTP/2 frame header: length (24 bits), type, flags, stream id (31 bits).
const FRAME_HEADER_LEN: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
/// The ACK flag of SETTINGS and PING frames: an acknowledgement, not a request.
const ACK: u8 = 0x1;
/// RFC 9113 §7: the peer may be generating excessive load.
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// The window control frames are counted in.
const WINDOW: Duration = Duration::from_secs(1);

/// The control frames the guard counts, each kind apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlFrame {
    Ping,
    Settings,
}

impl ControlFrame {
    /// The GOAWAY debug text and the metric/log label.
    pub fn label(self) -> &'static str {
        match self {
            ControlFrame::Ping => "ping_flood",
            ControlFrame::Settings => "settings_flood",
        }
    }
}

/// One frame header.
#[derive(Debug, Clone, Copy)]
struct FrameHeader {
    length: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    fn parse(bytes: &[u8; FRAME_HEADER_LEN]) -> Self {
        Self {
            length: u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize,
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }

    /// A PING or SETTINGS frame that asks for an acknowledgement.
    fn control(&self) -> Option<ControlFrame> {
        match (self.kind, self.flags & ACK) {
            (PING, 0) => Some(ControlFrame::Ping),
            (SETTINGS, 0) => Some(ControlFrame::Settings),
            _ => None,
        }
    }
}

/// Follows the frame boundaries of one direction of a connection, across reads or writes that
/// cut frames anywhere.
#[derive(Debug)]
struct FrameScanner {
    header: [u8; FRAME_HEADER_LEN],
    filled: usize,
    /// Bytes still to pass before the next frame header: a payload, or the client preface.
    skip: usize,
}

impl FrameScanner {
    fn after(skip: usize) -> Self {
        Self {
            header: [0; FRAME_HEADER_LEN],
            filled: 0,
            skip,
        }
    }

    /// Calls `seen` with each frame header completed in `bytes`.
    fn scan(&mut self, mut bytes: &[u8], mut seen: impl FnMut(FrameHeader)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER_LEN - self.filled).min(bytes.len());
            self.header[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == FRAME_HEADER_LEN {
                self.filled = 0;
                let header = FrameHeader::parse(&self.header);
                self.skip = header.length;
                seen(header);
            }
        }
    }

    /// Whether the bytes so far end exactly at a frame boundary (a frame may be written here).
    fn at_boundary(&self) -> bool {
        self.filled == 0 && self.skip == 0
    }
}

/// The control frames a client sent in the current window.
#[derive(Debug)]
struct ControlBudget {
    per_window: u32,
    window_start: Instant,
    pings: u32,
    settings: u32,
}

impl ControlBudget {
    fn new(per_window: u32) -> Self {
        Self {
            per_window,
            window_start: Instant::now(),
            pings: 0,
            settings: 0,
        }
    }

    /// Counts a control frame from the client; `Err` names the kind that went over the limit.
    fn spend(&mut self, frame: ControlFrame) -> Result<(), ControlFrame> {
        if self.window_start.elapsed() >= WINDOW {
            self.refill();
        }
        let count = match frame {
            ControlFrame::Ping => &mut self.pings,
            ControlFrame::Settings => &mut self.settings,
        };
        *count += 1;
        if *count > self.per_window {
            Err(frame)
        } else {
            Ok(())
        }
    }

    /// A new window: after a second, or when the broker sent data (pings answering data are
    /// how gRPC clients size their windows).
    fn refill(&mut self) {
        self.window_start = Instant::now();
        self.pings = 0;
        self.settings = 0;
    }
}

/// A client connection (after TLS, if any) with the flood guard on its frames. The first bytes
/// read are `replay` (the client preface the admission step already read).
pub struct FloodGuard<IO> {
    io: IO,
    replay: Vec<u8>,
    replayed: usize,
    from_client: FrameScanner,
    to_client: FrameScanner,
    budget: ControlBudget,
    /// The highest stream id the client opened: the GOAWAY's last stream id.
    last_stream: u32,
    closing: Option<Closing>,
}

/// A GOAWAY on its way out, after which the connection ends.
#[derive(Debug)]
struct Closing {
    frame: Vec<u8>,
    sent: usize,
}

impl<IO> FloodGuard<IO> {
    /// Guards `io`, whose first bytes are `preface` (already read from it), allowing
    /// `per_second` PING and `per_second` SETTINGS frames a second.
    pub fn new(io: IO, preface: Vec<u8>, per_second: u32) -> Self {
        Self {
            io,
            from_client: FrameScanner::after(preface.len()),
            replay: preface,
            replayed: 0,
            to_client: FrameScanner::after(0),
            budget: ControlBudget::new(per_second),
            last_stream: 0,
            closing: None,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Scans bytes read from the client; `Err` when they exceed the budget.
    fn watch_client(&mut self, bytes: &[u8]) -> Result<(), ControlFrame> {
        let mut flood = Ok(());
        let (budget, last_stream) = (&mut self.budget, &mut self.last_stream);
        self.from_client.scan(bytes, |header| {
            if header.kind == HEADERS {
                *last_stream = (*last_stream).max(header.stream);
            }
            if let Some(frame) = header.control()
                && flood.is_ok()
            {
                flood = budget.spend(frame);
            }
        });
        flood
    }

    /// Scans bytes written to the client: data or headers refill the budget.
    fn watch_broker(&mut self, bytes: &[u8]) {
        let budget = &mut self.budget;
        self.to_client.scan(bytes, |header| {
            if matches!(header.kind, DATA | HEADERS) {
                budget.refill();
            }
        });
    }

    /// Starts closing: a GOAWAY ENHANCE_YOUR_CALM if the broker's own output is between frames
    /// (never inside one of h2's frames), then the end of the connection.
    fn close_for(&mut self, flood: ControlFrame) {
        tracing::warn!(
            kind = flood.label(),
            limit = self.budget.per_window,
            "closing a client connection: too many control frames (--max-control-frames-per-second)"
        );
        crate::observe::meters::connection_closed(flood.label());
        let frame = if self.to_client.at_boundary() {
            goaway(self.last_stream, flood.label().as_bytes())
        } else {
            Vec::new()
        };
        self.closing = Some(Closing { frame, sent: 0 });
    }
}

/// A GOAWAY frame with `ENHANCE_YOUR_CALM` and `debug` as its debug data.
fn goaway(last_stream: u32, debug: &[u8]) -> Vec<u8> {
    let length = (8 + debug.len()) as u32;
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + length as usize);
    frame.extend_from_slice(&length.to_be_bytes()[1..]);
    frame.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    frame.extend_from_slice(&last_stream.to_be_bytes());
    frame.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
    frame.extend_from_slice(debug);
    frame
}

impl<IO: AsyncWrite + Unpin> FloodGuard<IO> {
    /// Sends what is left of the GOAWAY, then fails: the server drops the connection.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let Some(closing) = &mut self.closing else {
            unreachable!("poll_close is only called while closing");
        };
        while closing.sent < closing.frame.len() {
            match Pin::new(&mut self.io).poll_write(cx, &closing.frame[closing.sent..]) {
                Poll::Ready(Ok(n)) if n > 0 => closing.sent += n,
                Poll::Ready(_) => break,
                Poll::Pending => return Poll::Pending,
            }
        }
        closing.sent = closing.frame.len();
        let _ = ready!(Pin::new(&mut self.io).poll_flush(cx));
        Poll::Ready(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "closed for a control-frame flood",
        ))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for FloodGuard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closing.is_some() {
            return this.poll_close(cx).map(Err);
        }
        let before = buf.filled().len();
        if this.replayed < this.replay.len() {
            let n = (this.replay.len() - this.replayed).min(buf.remaining());
            buf.put_slice(&this.replay[this.replayed..this.replayed + n]);
            this.replayed += n;
        } else {
            ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        }
        if let Err(flood) = this.watch_client(&buf.filled()[before..]) {
            // Nothing of the flood reaches h2.
            buf.set_filled(before);
            this.close_for(flood);
            return this.poll_close(cx).map(Err);
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for FloodGuard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closing.is_some() {
            return this.poll_close(cx).map(Err);
        }
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.watch_broker(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closing.is_some() {
            return this.poll_close(cx).map(Err);
        }
        let mut n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        let written = n;
        for slice in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(slice.len());
            this.watch_broker(&slice[..take]);
            n -= take;
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        bytes.extend_from_slice(&[kind, flags]);
        bytes.extend_from_slice(&stream.to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn frame_headers_are_found_however_the_bytes_are_cut() {
        let mut stream = b"PREFACE".to_vec();
        stream.extend(frame(SETTINGS, 0, 0, &[0; 6]));
        stream.extend(frame(HEADERS, 4, 3, &[1; 40]));
        stream.extend(frame(PING, ACK, 0, &[0; 8]));
        stream.extend(frame(PING, 0, 0, &[0; 8]));
        for cut in 1..stream.len() {
            let mut scanner = FrameScanner::after(7);
            let mut seen = Vec::new();
            for piece in stream.chunks(cut) {
                scanner.scan(piece, |h| seen.push((h.kind, h.flags, h.stream, h.length)));
            }
            assert_eq!(
                seen,
                vec![
                    (SETTINGS, 0, 0, 6),
                    (HEADERS, 4, 3, 40),
                    (PING, ACK, 0, 8),
                    (PING, 0, 0, 8)
                ],
                "cut every {cut} bytes"
            );
            assert!(scanner.at_boundary());
        }
    }

    #[test]
    fn pings_past_the_limit_close_the_connection_unless_the_broker_sent_data_between() {
        let ping = frame(PING, 0, 0, &[0; 8]);
        let mut guard = FloodGuard::new((), Vec::new(), 3);
        for _ in 0..3 {
            assert_eq!(guard.watch_client(&ping), Ok(()));
            // A ping answering data is how a gRPC client measures bandwidth: never a flood.
            guard.watch_broker(&frame(DATA, 0, 1, &[0; 100]));
        }
        assert_eq!(guard.watch_client(&ping.repeat(3)), Ok(()));
        assert_eq!(guard.watch_client(&ping), Err(ControlFrame::Ping));
    }

    #[test]
    fn acknowledgements_are_not_counted_and_settings_have_a_budget_of_their_own() {
        let mut guard = FloodGuard::new((), Vec::new(), 2);
        let acks = [frame(PING, ACK, 0, &[0; 8]), frame(SETTINGS, ACK, 0, &[])].concat();
        assert_eq!(guard.watch_client(&acks.repeat(10)), Ok(()));
        assert_eq!(
            guard.watch_client(&frame(PING, 0, 0, &[0; 8]).repeat(2)),
            Ok(())
        );
        let settings = frame(SETTINGS, 0, 0, &[]);
        assert_eq!(guard.watch_client(&settings.repeat(2)), Ok(()));
        assert_eq!(guard.watch_client(&settings), Err(ControlFrame::Settings));
    }

    #[test]
    fn the_goaway_names_the_last_stream_and_enhance_your_calm() {
        let mut guard = FloodGuard::new((), Vec::new(), 1);
        let _ = guard.watch_client(&frame(HEADERS, 4, 7, &[0; 3]));
        let bytes = goaway(guard.last_stream, b"ping_flood");
        assert_eq!(&bytes[..9], &[0, 0, 18, GOAWAY, 0, 0, 0, 0, 0]);
        assert_eq!(&bytes[9..13], &7u32.to_be_bytes());
        assert_eq!(&bytes[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert_eq!(&bytes[17..], b"ping_flood");
    }
}
