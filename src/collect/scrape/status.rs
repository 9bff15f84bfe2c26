//! The scrape targets' part of the status document (`collectors.scrape`, a list of
//! [`crate::status::ScrapeTarget`]): one cell per target that only its own task updates.
//! It never scrapes.

use crate::status::{ScrapeTarget, StatusCell};

/// Every target's live status, in config order.
#[derive(Debug, Default)]
pub struct ScrapeStatus {
    targets: Vec<StatusCell<ScrapeTarget>>,
}

/// The URL to show: any `user:password@` part removed.
pub fn display_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let host_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..host_end].rfind('@') {
            return format!("{scheme}://{}", &rest[at + 1..]);
        }
    }
    url.to_string()
}

impl ScrapeStatus {
    /// One cell per configured target.
    pub fn new(targets: &[super::ScrapeConfig]) -> ScrapeStatus {
        ScrapeStatus {
            targets: targets
                .iter()
                .map(|t| {
                    StatusCell::new(ScrapeTarget {
                        name: t.name.clone(),
                        url: display_url(&t.url),
                        ..ScrapeTarget::default()
                    })
                })
                .collect(),
        }
    }

    pub(super) fn update<R>(&self, i: usize, f: impl FnOnce(&mut ScrapeTarget) -> R) -> Option<R> {
        self.targets.get(i).map(|c| c.update(f))
    }

    /// The `collectors.scrape` list.
    pub fn snapshot(&self) -> Vec<ScrapeTarget> {
        self.targets.iter().map(|c| c.snapshot()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show() {
        assert_eq!(
            display_url("http://u:pw@127.0.0.1:9/m?x=@"),
            "http://127.0.0.1:9/m?x=@"
        );
        assert_eq!(display_url("http://127.0.0.1:9/m"), "http://127.0.0.1:9/m");
    }
}
