//! `[config] watch = true`: every 2 s the config file's size, mtime and content hash are
//! compared with the last seen; a change that holds still for one more look (an editor
//! writing in steps, a copy in progress) asks for a reload. It only asks: it never reads
//! the config as config and never applies anything. A file that cannot be read is no change
//! (the reload it would ask for would only fail); it is logged once.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::config::layers::{ReloadRequest, ReloadSender, Trigger};

/// How often the file is looked at.
pub const POLL: Duration = Duration::from_secs(2);
/// How long a change must hold still before it is reloaded.
const SETTLE: Duration = Duration::from_millis(300);

/// What the watcher compares: size, mtime and the content's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    len: u64,
    mtime: Option<SystemTime>,
    hash: u64,
}

/// The file as it is now (`None`: it cannot be read).
pub fn look(path: &Path) -> Option<Seen> {
    let meta = std::fs::metadata(path).ok()?;
    let bytes = std::fs::read(path).ok()?;
    let mut h = crate::hash::Fnv64::new();
    h.write(&bytes);
    Some(Seen {
        len: meta.len(),
        mtime: meta.modified().ok(),
        hash: h.finish(),
    })
}

/// Watches `path` until `stop`, sending a reload request on each settled change.
pub async fn run(path: PathBuf, reload: ReloadSender, stop: CancellationToken) {
    watch(path, reload, stop, POLL, SETTLE).await
}

async fn watch(
    path: PathBuf,
    reload: ReloadSender,
    stop: CancellationToken,
    poll: Duration,
    settle: Duration,
) {
    let mut last = look(&path);
    let mut unreadable_logged = false;
    tracing::info!(file = %path.display(), "watching the config file for changes");
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
        let now = look(&path);
        if now.is_none() {
            if !unreadable_logged {
                tracing::warn!(file = %path.display(), "config file cannot be read; keeping the running config");
                unreadable_logged = true;
            }
            continue;
        }
        unreadable_logged = false;
        if now == last {
            continue;
        }
        // Debounce: the same state twice, SETTLE apart.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(settle) => {}
        }
        let settled = look(&path);
        if settled != now {
            continue;
        }
        last = settled;
        tracing::info!(file = %path.display(), "config file changed: reloading");
        let req = ReloadRequest {
            trigger: Trigger::FileWatch,
            reply: None,
        };
        // A full queue already holds a reload that will read this version.
        if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) = reload.try_send(req) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_same_size_edit_is_seen_and_a_missing_file_is_no_state() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "a = 1\n").unwrap();
        let first = look(&p).unwrap();
        assert_eq!(look(&p), Some(first.clone()));
        // Same size; the mtime may not move within the file system's resolution.
        std::fs::write(&p, "a = 2\n").unwrap();
        assert_ne!(look(&p), Some(first));
        std::fs::remove_file(&p).unwrap();
        assert_eq!(look(&p), None);
    }

    #[tokio::test]
    async fn an_edit_asks_for_one_reload() {
        const POLL: Duration = Duration::from_millis(50);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "a = 1\n").unwrap();
        let (tx, mut rx) = crate::reload::channel();
        let stop = CancellationToken::new();
        let task = tokio::spawn(watch(
            p.clone(),
            tx,
            stop.clone(),
            POLL,
            Duration::from_millis(10),
        ));
        tokio::time::sleep(POLL + Duration::from_millis(100)).await;
        assert!(rx.try_recv().is_err(), "no change, no reload");
        std::fs::write(&p, "a = 22\n").unwrap();
        let req = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a reload request in 5 s")
            .expect("channel open");
        assert_eq!(req.trigger, Trigger::FileWatch);
        tokio::time::sleep(POLL * 2).await;
        assert!(rx.try_recv().is_err(), "one edit, one reload");
        stop.cancel();
        task.await.unwrap();
    }
}
