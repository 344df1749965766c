//! Signed approval links through the facade (docs/answers.md): making one for a call a reader
//! may see, and opening one, which says which call it names and nothing more. Neither decides
//! anything; the signing and checking themselves are `crate::door::links`.

use std::sync::Arc;
use std::time::Duration;

use super::Broker;
use crate::domain::{Call, CallKey, Timestamp, Viewer};
use crate::door::links::{CallLink, LinkKey};
use crate::error::{Error, Result};

/// The key, how long a link lasts, and the inbox's base URL for whole URLs.
pub(super) struct Links {
    key: Arc<LinkKey>,
    lifetime: Duration,
    inbox_url: Option<String>,
}

/// A link made for a call: its token, and its URL when the inbox's base URL is configured.
pub struct MadeLink {
    pub link: CallLink,
    pub url: Option<String>,
}

impl Broker {
    /// The broker signing approval links with `key`, each valid for `lifetime`, as URLs of the
    /// inbox at `inbox_url` (`--webhooks-inbox-url`) when given.
    pub fn with_links(
        mut self,
        key: Arc<LinkKey>,
        lifetime: Duration,
        inbox_url: Option<String>,
    ) -> Self {
        self.links = Some(Links {
            key,
            lifetime,
            inbox_url,
        });
        self
    }

    fn links(&self) -> Result<&Links> {
        self.links.as_ref().ok_or_else(|| {
            Error::FailedPrecondition(
                "this broker makes no approval links: give it a key (--link-key; a SQLite \
                 broker makes one beside its database)"
                    .into(),
            )
        })
    }

    /// A link to `key`'s call, which `viewer` must be able to see (NOT_FOUND otherwise, as for
    /// an unknown call).
    pub async fn make_link(&self, key: &CallKey, viewer: &Viewer) -> Result<MadeLink> {
        let links = self.links()?;
        self.visible_call(key, viewer).await?;
        let link = links
            .key
            .sign(key, Timestamp::now().saturating_add(links.lifetime));
        let url = links.inbox_url.as_deref().map(|base| link.url(base));
        Ok(MadeLink { link, url })
    }

    /// The call `link` names, once its signature and expiry hold and `viewer` may see it. The
    /// caller still decides through `decide`, with the gate, as without a link.
    pub async fn open_link(&self, link: &CallLink, viewer: &Viewer) -> Result<Call> {
        let key = self.links()?.key.check(link, Timestamp::now())?;
        self.visible_call(&key, viewer).await
    }
}
