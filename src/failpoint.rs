//! Named points where the fault-injection tests make a gateway fail on purpose, to prove
//! what docs/architecture.md says a failure there leaves behind, or hold it to open a race
//! window. Set with the `failpoints` setting (`OJS_FAILPOINTS=leader.scheduler=panic`); unset,
//! every point is a no-op that costs one emptiness check. Never set in production.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What happens when execution reaches an armed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The task at the point panics, as a bug in it would.
    Panic,
    /// The whole process exits at once, as with `kill -9`: nothing is flushed or released.
    Exit,
    /// The task at the point waits this long, as a slow NATS or a descheduled process would.
    Delay(Duration),
}

/// The armed points of one gateway.
#[derive(Debug, Clone, Default)]
pub struct Failpoints(Arc<HashMap<String, Action>>);

impl Failpoints {
    /// Reads `name=action` pairs separated by commas; the actions are `panic`, `exit` and
    /// `delay(MS)`.
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
                other => other
                    .strip_prefix("delay(")
                    .and_then(|rest| rest.strip_suffix(')'))
                    .and_then(|ms| ms.parse().ok())
                    .map(|ms| Action::Delay(Duration::from_millis(ms)))
                    .ok_or_else(|| {
                        format!("unknown action {other:?} (panic, exit or delay(MS))")
                    })?,
            };
            points.insert(name.trim().to_owned(), action);
        }
        Ok(Failpoints(Arc::new(points)))
    }

    /// Fails or waits here if the point `name` is armed.
    pub async fn hit(&self, name: &str) {
        if self.0.is_empty() {
            return;
        }
        match self.0.get(name) {
            Some(Action::Panic) => panic!("failpoint {name} reached"),
            Some(Action::Exit) => {
                eprintln!("failpoint {name} reached: exiting");
                std::process::exit(86)
            }
            Some(Action::Delay(pause)) => tokio::time::sleep(*pause).await,
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_points_and_refuses_garbage() {
        let points = Failpoints::parse(" a.b=panic, c=exit , d=delay(250)").unwrap();
        assert_eq!(points.0.get("a.b"), Some(&Action::Panic));
        assert_eq!(points.0.get("c"), Some(&Action::Exit));
        assert_eq!(
            points.0.get("d"),
            Some(&Action::Delay(Duration::from_millis(250)))
        );
        points.hit("not.armed").await;
        assert!(Failpoints::parse("").unwrap().0.is_empty());
        for bad in [
            "a",
            "a=boom",
            "a=delay",
            "a=delay()",
            "a=delay(-1)",
            "a=delay(1",
        ] {
            assert!(Failpoints::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    #[should_panic(expected = "failpoint a reached")]
    async fn an_armed_panic_point_panics() {
        Failpoints::parse("a=panic").unwrap().hit("a").await;
    }

    #[tokio::test]
    async fn an_armed_delay_point_waits() {
        let started = std::time::Instant::now();
        Failpoints::parse("a=delay(400)").unwrap().hit("a").await;
        assert!(started.elapsed() >= Duration::from_millis(400));
    }
}
