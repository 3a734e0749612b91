//! Named points where the fault-injection tests make a gateway fail on purpose, to prove
//! what docs/architecture.md says a failure there leaves behind. Set with the `failpoints`
//! setting (`OJS_FAILPOINTS=leader.scheduler=panic`); unset, every point is a no-op that costs
//! one emptiness check. Never set in production.

use std::collections::HashMap;
use std::sync::Arc;

/// What happens when execution reaches an armed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The task at the point panics, as a bug in it would.
    Panic,
    /// The whole process exits at once, as with `kill -9`: nothing is flushed or released.
    Exit,
}

/// The armed points of one gateway.
#[derive(Debug, Clone, Default)]
pub struct Failpoints(Arc<HashMap<String, Action>>);

impl Failpoints {
    /// Reads `name=action` pairs separated by commas; the actions are `panic` and `exit`.
    ///
    /// # Errors
    /// The first pair that does not read, as a reason.
    pub fn parse(spec: &str) -> Result<Failpoints, String> {
        let mut points = HashMap::new();
        for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, action) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not name=action"))?;
            let action = match action.trim() {
                "panic" => Action::Panic,
                "exit" => Action::Exit,
                other => return Err(format!("unknown action {other:?} (panic or exit)")),
            };
            points.insert(name.trim().to_owned(), action);
        }
        Ok(Failpoints(Arc::new(points)))
    }

    /// Fails here if the point `name` is armed.
    pub fn hit(&self, name: &str) {
        if self.0.is_empty() {
            return;
        }
        match self.0.get(name) {
            Some(Action::Panic) => panic!("failpoint {name} reached"),
            Some(Action::Exit) => {
                eprintln!("failpoint {name} reached: exiting");
                std::process::exit(86)
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_points_and_refuses_garbage() {
        let points = Failpoints::parse(" a.b=panic, c=exit ,").unwrap();
        assert_eq!(points.0.get("a.b"), Some(&Action::Panic));
        assert_eq!(points.0.get("c"), Some(&Action::Exit));
        points.hit("not.armed");
        assert!(Failpoints::parse("").unwrap().0.is_empty());
        assert!(Failpoints::parse("a").is_err());
        assert!(Failpoints::parse("a=boom").is_err());
    }

    #[test]
    #[should_panic(expected = "failpoint a reached")]
    fn an_armed_panic_point_panics() {
        Failpoints::parse("a=panic").unwrap().hit("a");
    }
}
