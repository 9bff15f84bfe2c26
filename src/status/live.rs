//! [`Live`]: a part of the running agent that a live reload replaces whole (the sinks' and
//! notifiers' status lists, the scrape targets, the rollup plan): readers take the current
//! `Arc` and use it without a lock held; the reloader swaps in a new one. It never blocks
//! on IO and never panics on a poisoned lock.

use std::sync::Arc;

use super::StatusCell;

/// A shared, swappable `Arc<T>`.
#[derive(Debug)]
pub struct Live<T>(Arc<StatusCell<Arc<T>>>);

impl<T> Clone for Live<T> {
    fn clone(&self) -> Self {
        Live(self.0.clone())
    }
}

impl<T: Default> Default for Live<T> {
    fn default() -> Self {
        Live::new(T::default())
    }
}

impl<T> Live<T> {
    /// A holder of `value`.
    pub fn new(value: T) -> Live<T> {
        Live(Arc::new(StatusCell::new(Arc::new(value))))
    }

    /// The current value.
    pub fn get(&self) -> Arc<T> {
        self.0.read(Arc::clone)
    }

    /// Replaces the value with one already shared.
    pub fn set_arc(&self, value: Arc<T>) {
        self.0.update(|v| *v = value);
    }

    /// Replaces the value; readers holding the old one keep it until they drop it.
    pub fn set(&self, value: T) {
        self.0.update(|v| *v = Arc::new(value));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn readers_keep_what_they_took_and_see_the_new_value_next() {
        let l = super::Live::new(1);
        let old = l.get();
        l.clone().set(2);
        assert_eq!((*old, *l.get()), (1, 2));
    }
}
