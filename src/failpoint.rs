//! Named points where the fault-injection tests make a gateway fail on purpose, to prove
//! what docs/architecture.md says a failure there leaves behind, or hold it to open a race
//! window. Set with the `failpoints` setting (`OJS_FAILPOINTS=leader.scheduler=panic`); unset,
//! every point is a no-op that costs one emptiness check. Never set in production.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
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
    /// The first N times the point is reached, the message its task just received is lost,
    /// as one in flight on a connection that died (`Failpoints::loses`).
    Lose(u32),
}

/// The armed points of one gateway, each with how often it was reached.
#[derive(Debug, Clone, Default)]
pub struct Failpoints(Arc<HashMap<String, (Action, AtomicU32)>>);

impl Failpoints {
    /// Reads `name=action` pairs separated by commas; the actions are `panic`, `exit`,
    /// `delay(MS)` and `lose(N)`.
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
                other => {
                    let argument = |action: &str| {
                        other
                            .strip_prefix(action)
                            .and_then(|rest| rest.strip_prefix('('))
                            .and_then(|rest| rest.strip_suffix(')'))
                    };
                    let delay = argument("delay").and_then(|ms| ms.parse().ok());
                    let lose = argument("lose").and_then(|n| n.parse().ok());
                    match (delay, lose) {
                        (Some(ms), _) => Action::Delay(Duration::from_millis(ms)),
                        (_, Some(n)) => Action::Lose(n),
                        _ => {
                            return Err(format!(
                                "unknown action {other:?} (panic, exit, delay(MS) or lose(N))"
                            ))
                        }
                    }
                }
            };
            points.insert(name.trim().to_owned(), (action, AtomicU32::new(0)));
        }
        Ok(Failpoints(Arc::new(points)))
    }

    /// Fails or waits here if the point `name` is armed.
    pub async fn hit(&self, name: &str) {
        if self.0.is_empty() {
            return;
        }
        match self.0.get(name).map(|(action, _)| action) {
            Some(Action::Panic) => panic!("failpoint {name} reached"),
            Some(Action::Exit) => {
                eprintln!("failpoint {name} reached: exiting");
                std::process::exit(86)
            }
            Some(Action::Delay(pause)) => tokio::time::sleep(*pause).await,
            Some(Action::Lose(_)) | None => {}
        }
    }

    /// Whether the task at `name` is to drop the message it just received: the first N
    /// times a point armed with `lose(N)` asks.
    pub fn loses(&self, name: &str) -> bool {
        if self.0.is_empty() {
            return false;
        }
        match self.0.get(name) {
            Some((Action::Lose(n), reached)) => reached.fetch_add(1, Ordering::Relaxed) < *n,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_points_and_refuses_garbage() {
        let points = Failpoints::parse(" a.b=panic, c=exit , d=delay(250), e=lose(2)").unwrap();
        let action = |name| points.0.get(name).map(|(action, _)| *action);
        assert_eq!(action("a.b"), Some(Action::Panic));
        assert_eq!(action("c"), Some(Action::Exit));
        assert_eq!(action("d"), Some(Action::Delay(Duration::from_millis(250))));
        assert_eq!(action("e"), Some(Action::Lose(2)));
        points.hit("not.armed").await;
        assert!(Failpoints::parse("").unwrap().0.is_empty());
        for bad in [
            "a",
            "a=boom",
            "a=delay",
            "a=delay()",
            "a=delay(-1)",
            "a=delay(1",
            "a=lose",
            "a=lose(-1)",
            "a=delays(1)",
        ] {
            assert!(Failpoints::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    #[should_panic(expected = "failpoint a reached")]
    async fn an_armed_panic_point_panics() {
        Failpoints::parse("a=panic").unwrap().hit("a").await;
    }

    #[test]
    fn a_lose_point_loses_its_first_n_messages_only() {
        let points = Failpoints::parse("a=lose(2),b=delay(1)").unwrap();
        let lost: Vec<bool> = (0..4).map(|_| points.loses("a")).collect();
        assert_eq!(lost, [true, true, false, false]);
        assert!(!points.loses("b"));
        assert!(!points.loses("not.armed"));
    }

    #[tokio::test]
    async fn an_armed_delay_point_waits() {
        let started = std::time::Instant::now();
        Failpoints::parse("a=delay(400)").unwrap().hit("a").await;
        assert!(started.elapsed() >= Duration::from_millis(400));
    }
}
