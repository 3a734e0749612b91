//! An ordered, named middleware chain (middleware spec §3): add, remove, insert before or
//! after a named entry. Shared by the client's enqueue chain and the worker's execution chain.

use std::sync::Arc;

/// Middleware of type `M` in the order they run, outermost first.
pub struct Chain<M: ?Sized> {
    items: Vec<(String, Arc<M>)>,
}

impl<M: ?Sized> Default for Chain<M> {
    fn default() -> Self {
        Chain { items: Vec::new() }
    }
}

impl<M: ?Sized> Clone for Chain<M> {
    fn clone(&self) -> Self {
        Chain {
            items: self.items.clone(),
        }
    }
}

impl<M: ?Sized> Chain<M> {
    /// Appends `middleware` as the innermost one.
    pub fn add(&mut self, name: &str, middleware: Arc<M>) -> &mut Self {
        self.items.push((name.to_owned(), middleware));
        self
    }

    /// Removes the middleware called `name`; `false` when there is none.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.items.len();
        self.items.retain(|(n, _)| n != name);
        self.items.len() != before
    }

    /// Inserts `middleware` just outside `anchor`; `false` (and nothing inserted) when
    /// `anchor` is not in the chain.
    pub fn insert_before(&mut self, anchor: &str, name: &str, middleware: Arc<M>) -> bool {
        self.insert_at(anchor, 0, name, middleware)
    }

    /// Inserts `middleware` just inside `anchor`.
    pub fn insert_after(&mut self, anchor: &str, name: &str, middleware: Arc<M>) -> bool {
        self.insert_at(anchor, 1, name, middleware)
    }

    fn insert_at(&mut self, anchor: &str, offset: usize, name: &str, middleware: Arc<M>) -> bool {
        match self.items.iter().position(|(n, _)| n == anchor) {
            Some(i) => {
                self.items.insert(i + offset, (name.to_owned(), middleware));
                true
            }
            None => false,
        }
    }

    /// The names, outermost first.
    pub fn names(&self) -> Vec<&str> {
        self.items.iter().map(|(n, _)| n.as_str()).collect()
    }

    pub(crate) fn items(&self) -> &[(String, Arc<M>)] {
        &self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_remove_and_insert_around_names() {
        let mut c: Chain<str> = Chain::default();
        c.add("a", Arc::from("A")).add("c", Arc::from("C"));
        assert!(c.insert_before("c", "b", Arc::from("B")));
        assert!(c.insert_after("c", "d", Arc::from("D")));
        assert!(!c.insert_after("zz", "e", Arc::from("E")));
        assert_eq!(c.names(), ["a", "b", "c", "d"]);
        assert!(c.remove("b"));
        assert!(!c.remove("b"));
        assert_eq!(c.names(), ["a", "c", "d"]);
    }
}
