//! Caps on open streams (agent streams, subscribers), so a flood of clients gets
//! RESOURCE_EXHAUSTED while everyone already connected goes on being served.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::observe::meters::{self, StreamKind};

/// A counted kind of open stream, at most `max` at once.
#[derive(Debug)]
pub struct StreamSlots {
    kind: StreamKind,
    what: &'static str,
    setting: &'static str,
    max: usize,
    open: AtomicUsize,
}

/// One open stream; frees its slot when dropped (when the stream's task ends).
#[derive(Debug)]
pub struct StreamSlot(Arc<StreamSlots>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let open = self.0.open.fetch_sub(1, Ordering::SeqCst) - 1;
        meters::streams_open(self.0.kind, open);
    }
}

impl StreamSlots {
    /// `what` names the streams in errors; `setting` the flag that raises the cap; `kind` the
    /// gauge that counts them.
    pub fn new(
        kind: StreamKind,
        what: &'static str,
        setting: &'static str,
        max: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            kind,
            what,
            setting,
            max,
            open: AtomicUsize::new(0),
        })
    }

    /// Takes a slot, or refuses with RESOURCE_EXHAUSTED when all are taken.
    pub fn take(self: &Arc<Self>) -> Result<StreamSlot> {
        let taken = self
            .open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| {
                (open < self.max).then_some(open + 1)
            });
        match taken {
            Ok(before) => {
                meters::streams_open(self.kind, before + 1);
                Ok(StreamSlot(Arc::clone(self)))
            }
            Err(_) => Err(Error::ResourceExhausted(format!(
                "too many open {} (at most {}, set by {}); try again later",
                self.what, self.max, self.setting
            ))),
        }
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_and_freed_when_dropped() {
        let slots = StreamSlots::new(
            StreamKind::Subscriber,
            "subscribers",
            "--max-subscribers",
            2,
        );
        let a = slots.take().unwrap();
        let _b = slots.take().unwrap();
        let err = slots.take().unwrap_err().to_string();
        assert!(err.contains("--max-subscribers"), "{err}");
        drop(a);
        assert_eq!(slots.open(), 1);
        assert!(slots.take().is_ok());
    }
}
