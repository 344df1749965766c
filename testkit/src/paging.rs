//! Reading a paged listing (ListCalls, ListGrants, ...) to its last page, written once: the API
//! tests and the crash harness both read whole listings, and a loop that stopped one page early
//! would hide calls from their checks.

use std::future::Future;

/// Every page of a listing, in order: `fetch(token)` reads the page at `token` (empty for the
/// first) and returns it with the token of the next one, empty after the last.
pub async fn every_page<P, F, Fut>(mut fetch: F) -> Vec<P>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = (P, String)>,
{
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let (page, next) = fetch(token).await;
        pages.push(page);
        if next.is_empty() {
            return pages;
        }
        token = next;
    }
}
