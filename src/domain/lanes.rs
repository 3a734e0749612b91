//! Which new lanes a PUSH may create. A lane is a queue's priority: in JetStream a stream per
//! queue and a consumer per priority, never removed (architecture §6). Without a bound one
//! batch of 10,000 distinct queue names would create 10,000 streams.

use std::collections::{BTreeMap, BTreeSet};

use super::error::OjsError;

/// The cluster-wide bounds (settings `max_queues`, `max_priorities_per_queue`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneLimits {
    pub max_queues: usize,
    pub max_priorities_per_queue: usize,
}

/// Refuses `lanes` when creating the new ones among them would exceed `limits`: `in_use(q)`
/// gives the priorities queue `q` already has (`None`: no such queue yet) and `queues` how
/// many queues exist. Nothing of a refused PUSH is written.
///
/// # Errors
/// 400 `invalid_request` naming the field and the limit.
pub fn admit<'a>(
    lanes: impl IntoIterator<Item = (&'a str, i32)>,
    in_use: impl Fn(&str) -> Option<Vec<i32>>,
    queues: usize,
    limits: LaneLimits,
) -> Result<(), OjsError> {
    let mut wanted: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
    for (queue, priority) in lanes {
        wanted.entry(queue).or_default().insert(priority);
    }
    let mut new_queues = 0;
    for (queue, priorities) in wanted {
        let existing = in_use(queue);
        if existing.is_none() {
            new_queues += 1;
        }
        let existing = existing.unwrap_or_default();
        let total = existing.len() + priorities.iter().filter(|p| !existing.contains(p)).count();
        if total > limits.max_priorities_per_queue {
            return Err(OjsError::invalid(
                "priority",
                format!(
                    "queue {queue:?} would use {total} distinct priorities; at most {} are allowed per queue (setting max_priorities_per_queue).",
                    limits.max_priorities_per_queue
                ),
            )
            .with_detail("max_priorities_per_queue", limits.max_priorities_per_queue));
        }
    }
    admit_queues(queues + new_queues, limits)
}

/// Refuses a registry of `total` queues when that is past `max_queues`: what a PUSH into new
/// queues and a pause of a queue never seen (it registers the queue) are checked against.
///
/// # Errors
/// 400 `invalid_request` naming the field and the limit.
pub fn admit_queues(total: usize, limits: LaneLimits) -> Result<(), OjsError> {
    if total > limits.max_queues {
        return Err(OjsError::invalid(
            "queue",
            format!(
                "this would make {total} queues; at most {} are allowed (setting max_queues).",
                limits.max_queues
            ),
        )
        .with_detail("max_queues", limits.max_queues));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: LaneLimits = LaneLimits {
        max_queues: 3,
        max_priorities_per_queue: 2,
    };

    fn in_use(queue: &str) -> Option<Vec<i32>> {
        (queue == "a").then(|| vec![5])
    }

    #[test]
    fn known_lanes_and_new_ones_within_the_limits_pass() {
        admit([("a", 5), ("a", 5)], in_use, 1, LIMITS).unwrap();
        admit([("a", 1), ("b", 1), ("b", 2), ("c", 0)], in_use, 1, LIMITS).unwrap();
    }

    #[test]
    fn a_new_queue_past_the_limit_is_refused() {
        let e = admit([("b", 0), ("c", 0), ("d", 0)], in_use, 1, LIMITS).unwrap_err();
        assert_eq!(e.details["field"], "queue");
        assert_eq!(e.details["max_queues"], 3);
        admit([("a", 0)], in_use, 3, LIMITS).unwrap();
    }

    #[test]
    fn a_new_priority_past_the_limit_is_refused() {
        let e = admit([("a", 1), ("a", 2)], in_use, 1, LIMITS).unwrap_err();
        assert_eq!(e.details["field"], "priority");
        let e = admit([("b", 1), ("b", 2), ("b", 3)], in_use, 1, LIMITS).unwrap_err();
        assert_eq!(e.details["max_priorities_per_queue"], 2);
    }
}
