//! Pages cut by size as well as by count (see [`oversize`](super::oversize)). A page of calls or
//! grants ends early when the next item would push the encoded reply past the reply limit, and
//! its `next_page_token` continues right after the last item sent. The broker is read a few rows
//! at a time, so a page of large calls never holds much more in memory than the reply itself.
//! Rules, few and read whole, are paged in precedence order the same way.

use std::cmp::Reverse;
use std::future::Future;

use super::oversize::Room;
use super::render;
use crate::broker::Broker;
use crate::domain::Timestamp;
use crate::domain::policy::{Rule, rule_precedence, sort_by_precedence};
use crate::domain::{Call, CallQuery, Cursor, GrantQuery};
use crate::error::{Error, Result};
use crate::proto::v1 as pb;

/// Rows read at a time while a page is filled.
const CHUNK: u32 = 32;

/// One page of a listing, as sent, and the cursor to continue after it (`None` on the last).
pub struct Page<M> {
    pub items: Vec<M>,
    pub next: Option<Cursor>,
}

/// A page of the calls `query` selects that `visible` admits (the others are passed over, and
/// the page may then hold fewer), of at most `query.limit` calls and `reply_limit` bytes.
pub async fn calls(
    broker: &Broker,
    query: &CallQuery,
    reply_limit: usize,
    visible: impl Fn(&Call) -> bool,
) -> Result<Page<pb::Call>> {
    let read = |after, limit| {
        let mut query = query.clone();
        query.after = after;
        query.limit = limit;
        async move {
            let page = broker.list_calls(&query).await?;
            Ok(Chunk {
                items: page.calls,
                cursors: page.cursors,
                more: page.next.is_some(),
            })
        }
    };
    fill(
        query.limit,
        query.after,
        reply_limit,
        read,
        visible,
        render::call,
    )
    .await
}

/// A page of the grants `query` selects, judged active or not at `now`.
pub async fn grants(
    broker: &Broker,
    query: &GrantQuery,
    reply_limit: usize,
    now: Timestamp,
) -> Result<Page<pb::Grant>> {
    let read = |after, limit| {
        let mut query = query.clone();
        query.after = after;
        query.limit = limit;
        async move {
            let page = broker.list_grants(&query).await?;
            Ok(Chunk {
                items: page.grants,
                cursors: page.cursors,
                more: page.next.is_some(),
            })
        }
    };
    let render_grant = |grant: &_| render::grant(grant, now);
    fill(
        query.limit,
        query.after,
        reply_limit,
        read,
        |_| true,
        render_grant,
    )
    .await
}

/// Rows of one read, each with the cursor after it.
struct Chunk<T> {
    items: Vec<T>,
    cursors: Vec<Cursor>,
    /// More rows follow the last one.
    more: bool,
}

/// Reads chunks after `start` and renders their items until the page holds `wanted` items, the
/// next item would not fit in the reply, or the listing ends.
async fn fill<T, M, Read, Fut>(
    wanted: u32,
    start: Option<Cursor>,
    reply_limit: usize,
    mut read: Read,
    keep: impl Fn(&T) -> bool,
    render: impl Fn(&T) -> M,
) -> Result<Page<M>>
where
    M: prost::Message,
    Read: FnMut(Option<Cursor>, u32) -> Fut,
    Fut: Future<Output = Result<Chunk<T>>>,
{
    let wanted = wanted as usize;
    let mut room = Room::new(reply_limit);
    let mut items = Vec::new();
    let mut after = start;
    loop {
        let chunk = read(after, (wanted - items.len()).min(CHUNK as usize) as u32).await?;
        for (item, cursor) in chunk.items.iter().zip(chunk.cursors) {
            if !keep(item) {
                // Passed over, but passed: the next read starts after it.
                after = Some(cursor);
                continue;
            }
            let rendered = render(item);
            if !room.take(&rendered) {
                if items.is_empty() {
                    // The configuration makes sure one item fits (`oversize::reply_limit`);
                    // an empty page would send the client round in circles.
                    return Err(Error::ResourceExhausted(
                        "one item of this listing is larger than the reply limit; raise \
                         --max-reply-bytes"
                            .into(),
                    ));
                }
                return Ok(Page { items, next: after });
            }
            items.push(rendered);
            after = Some(cursor);
        }
        if !chunk.more {
            return Ok(Page { items, next: None });
        }
        if items.len() >= wanted {
            return Ok(Page { items, next: after });
        }
    }
}

/// The most rules one ListRules page holds when the request names a page size.
const MAX_RULES_PAGE: u32 = 1000;

/// A page of `rules` in precedence order, after `page_token`: at most `page_size` rules (0: no
/// count limit) that fit in `reply_limit`, and the token of the next page (empty on the last).
/// The token names the last rule's place in the order, not an index, so a rule added or removed
/// between pages shifts nothing.
pub fn rules(
    mut rules: Vec<Rule>,
    page_size: u32,
    page_token: &str,
    reply_limit: usize,
) -> Result<(Vec<pb::Rule>, String)> {
    if page_size > MAX_RULES_PAGE {
        return Err(Error::invalid(
            "page_size",
            format!("must be at most {MAX_RULES_PAGE}, got {page_size}"),
        ));
    }
    let after = RulePlace::parse(page_token)?;
    sort_by_precedence(&mut rules);
    let wanted = if page_size == 0 {
        usize::MAX
    } else {
        page_size as usize
    };
    let mut room = Room::new(reply_limit);
    let mut page = Vec::new();
    let mut last: Option<&Rule> = None;
    let mut remaining = rules
        .iter()
        .filter(|rule| after.as_ref().is_none_or(|a| a.is_before(rule)))
        .peekable();
    while page.len() < wanted
        && let Some(rule) = remaining.peek()
    {
        let rendered = render::rule(rule);
        if !room.take(&rendered) {
            break;
        }
        page.push(rendered);
        last = remaining.next();
    }
    let token = match (remaining.peek(), last) {
        (Some(_), Some(last)) => RulePlace::of(last).token(),
        (Some(_), None) => {
            return Err(Error::ResourceExhausted(
                "one rule is larger than the reply limit; raise --max-reply-bytes".into(),
            ));
        }
        (None, _) => String::new(),
    };
    Ok((page, token))
}

/// A rule's place in precedence order ([`rule_precedence`]), as a page token carries it.
struct RulePlace {
    class: u8,
    priority: i32,
    effect: u8,
    id: String,
}

impl RulePlace {
    fn of(rule: &Rule) -> Self {
        let (class, Reverse(priority), effect, id) = rule_precedence(rule);
        RulePlace {
            class,
            priority,
            effect,
            id: id.to_owned(),
        }
    }

    fn token(&self) -> String {
        format!(
            "r1.{}.{}.{}.{}",
            self.class, self.priority, self.effect, self.id
        )
    }

    fn parse(token: &str) -> Result<Option<Self>> {
        if token.is_empty() {
            return Ok(None);
        }
        let invalid = || Error::invalid("page_token", "is not a token this broker issued");
        let mut parts = token
            .strip_prefix("r1.")
            .ok_or_else(invalid)?
            .splitn(4, '.');
        let mut next = || parts.next().ok_or_else(invalid);
        Ok(Some(RulePlace {
            class: next()?.parse().map_err(|_| invalid())?,
            priority: next()?.parse().map_err(|_| invalid())?,
            effect: next()?.parse().map_err(|_| invalid())?,
            id: next()?.to_owned(),
        }))
    }

    /// Whether this place comes before `rule` in precedence order.
    fn is_before(&self, rule: &Rule) -> bool {
        let here = (
            self.class,
            Reverse(self.priority),
            self.effect,
            self.id.as_str(),
        );
        here < rule_precedence(rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::policy::{Glob, Matcher, RuleEffect, RuleId, RuleSource};

    fn rule(id: &str, effect: RuleEffect, priority: i32) -> Rule {
        Rule {
            kind: None,
            approvers: None,
            id: RuleId::parse("id", id).unwrap(),
            tool: Glob::parse("tool", "*").unwrap(),
            matcher: Matcher::Any,
            effect,
            priority,
            description: String::new(),
            source: RuleSource::Admin,
            created_at: Timestamp::from_micros(0),
            mode: Default::default(),
            escalation: Default::default(),
        }
    }

    fn ids(page: &[pb::Rule]) -> Vec<&str> {
        page.iter().map(|r| r.id.as_str()).collect()
    }

    #[test]
    fn a_rule_page_continues_after_its_last_rule_even_when_rules_change_between_pages() {
        let rules = vec![
            rule("allow.a", RuleEffect::Allow, 0),
            rule("deny.z", RuleEffect::Deny, -5),
            rule("ask.b", RuleEffect::Ask, 3),
            rule("allow.c", RuleEffect::Allow, 3),
        ];
        let (first, token) = rules_page(rules.clone(), 2, "", 1 << 20).unwrap();
        assert_eq!(ids(&first), ["deny.z", "ask.b"]);
        assert!(!token.is_empty());

        // The last rule of the page is deleted and one is added before it: nothing repeats or
        // goes missing after it.
        let mut changed: Vec<Rule> = rules
            .into_iter()
            .filter(|r| r.id.as_str() != "ask.b")
            .collect();
        changed.push(rule("deny.y", RuleEffect::Deny, 0));
        let (rest, token) = rules_page(changed, 0, &token, 1 << 20).unwrap();
        assert_eq!(ids(&rest), ["allow.c", "allow.a"]);
        assert!(token.is_empty());
    }

    #[test]
    fn a_rule_page_token_the_broker_did_not_issue_is_refused_naming_the_field() {
        for token in ["x", "r1.", "r1.0.a.0.id", "v1.7"] {
            let err = rules_page(vec![], 0, token, 1 << 20).unwrap_err();
            assert!(err.to_string().starts_with("page_token"), "{token}: {err}");
        }
    }

    fn rules_page(
        rules: Vec<Rule>,
        size: u32,
        token: &str,
        limit: usize,
    ) -> Result<(Vec<pb::Rule>, String)> {
        super::rules(rules, size, token, limit)
    }
}
