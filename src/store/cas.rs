//! Compare-and-set on KV keys, shared by every bucket: which replica a read asks, what a
//! refused write means and how long to wait before the next round, and the one
//! read-change-write loop of the small JSON entries (workers, cron, queue registry). Job
//! records have their own loop (`transitions.rs`, `fetch.rs`): their writes carry trails,
//! a size check and what must be stored first.

use std::time::Duration;

use async_nats::jetstream::kv;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use super::deadline::{self, answered};
use super::error::{nats_failed, refusal, Refused};
use crate::domain::error::{ErrorCode, OjsError};

/// Compare-and-set attempts before an operation gives up under contention.
pub(super) const MAX_CAS_ATTEMPTS: usize = 16;

/// Which replica of a bucket's stream answers a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replica {
    /// Any (a direct get: the nearest answers).
    Nearest,
    /// The stream's leader. After a lost compare-and-set: a replica that lags (a node
    /// rejoining after a partition, answering the direct gets of the clients connected to
    /// it) would return the revision that just lost, round after round, until the
    /// operation gave up.
    Leader,
}

impl Replica {
    /// The replica to read from after a compare-and-set was or was not refused.
    pub(super) fn after(lost_race: bool) -> Replica {
        if lost_race {
            Replica::Leader
        } else {
            Replica::Nearest
        }
    }
}

/// What a compare-and-set write came to.
pub(super) enum Cas {
    Written(u64),
    Refused(Refused),
}

/// The last write of a key: its value (`None` for a delete or purge marker) and revision.
pub(super) struct Last {
    pub(super) value: Option<Bytes>,
    pub(super) revision: u64,
}

/// The key's last write as `from` has it; `None` when the key was never written (or its
/// history was purged away).
pub(super) async fn last(
    kv: &kv::Store,
    key: &str,
    from: Replica,
    doing: &str,
) -> Result<Option<Last>, OjsError> {
    if from == Replica::Nearest {
        let entry = answered(doing, || kv.entry(key))
            .await?
            .said
            .map_err(|e| nats_failed(doing, e))?;
        return Ok(entry.map(|e| Last {
            value: (e.operation == kv::Operation::Put).then_some(e.value),
            revision: e.revision,
        }));
    }
    let subject = format!("{}{key}", kv.prefix);
    let said = answered(doing, || {
        kv.stream.get_last_raw_message_by_subject(&subject)
    })
    .await?;
    match said.said {
        Ok(m) => Ok(Some(Last {
            // A put carries no operation header; deletes and purges name theirs.
            value: m.headers.get("KV-Operation").is_none().then_some(m.payload),
            revision: m.sequence,
        })),
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(err) => Err(nats_failed(doing, err)),
    }
}

/// Writes `value` if the key is still at `revision` (0: never written, or only deleted
/// before if `revision` names the marker), trying again while NATS does not answer
/// (`deadline.rs`).
///
/// A try whose answer was lost may have landed; the next try is then refused. So after
/// silence, a write still in flight is waited out (it may be this one), and an outdated
/// revision is checked against the key's first write after `revision` at the stream
/// leader: the very bytes of this write mean it landed (job records carry their times and
/// trail, so another writer's value differs).
pub(super) async fn write(
    kv: &kv::Store,
    key: &str,
    value: Bytes,
    revision: u64,
    doing: &str,
) -> Result<Cas, OjsError> {
    let mut after_silence = false;
    for round in 0..MAX_CAS_ATTEMPTS {
        let answer = answered(doing, || kv.update(key, value.clone(), revision)).await?;
        after_silence |= answer.after_silence;
        let err = match answer.said {
            Ok(rev) => return Ok(Cas::Written(rev)),
            Err(err) => err,
        };
        match refusal(&err, kv::UpdateErrorKind::WrongLastRevision) {
            Some(Refused::InFlight) if after_silence => pause_after(Refused::InFlight, round).await,
            Some(Refused::Outdated) if after_silence => {
                return landed(kv, key, revision, doing, |first| first == Some(&value)).await;
            }
            Some(why) => return Ok(Cas::Refused(why)),
            None => return Err(nats_failed(doing, err)),
        }
    }
    Ok(Cas::Refused(Refused::InFlight))
}

/// Whether a write refused after an unanswered try landed after all: the key's first write
/// after `since` (the revision the write was conditional on) at the stream leader is
/// `ours` (its value; `None` for a removal) — written at that revision — or another
/// writer's, an outdated revision. The first, not the last: a write that landed may
/// already have been followed by another (a failed job's retry made available again
/// while its FAIL waited out an election).
pub(super) async fn landed(
    kv: &kv::Store,
    key: &str,
    since: u64,
    doing: &str,
    ours: impl Fn(Option<&Bytes>) -> bool,
) -> Result<Cas, OjsError> {
    let subject = format!("{}{key}", kv.prefix);
    let mut pause = STALE_LEADER_PAUSE;
    loop {
        let said = answered(doing, || {
            kv.stream
                .raw_message_builder()
                .sequence(since + 1)
                .next_by_subject(subject.clone())
                .send()
        })
        .await?;
        match said.said {
            Ok(first) => {
                // A put carries no operation header; deletes and purges name theirs.
                let value = first
                    .headers
                    .get("KV-Operation")
                    .is_none()
                    .then_some(&first.payload);
                return Ok(if ours(value) {
                    Cas::Written(first.sequence)
                } else {
                    Cas::Refused(Refused::Outdated)
                });
            }
            // The refusal said the key moved past `since`, yet the leader has no write after
            // it: every write of the key was purged (a pruned job), or the leader answers
            // from before the write (one cut off by a partition does until it hears of its
            // successor), which is asked again until the deadline.
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
                if last(kv, key, Replica::Leader, doing).await?.is_none() {
                    return Ok(Cas::Refused(Refused::Outdated));
                }
                if Instant::now() + pause >= deadline::current() {
                    return Err(deadline::out_of_time(doing));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(err) => return Err(nats_failed(doing, err)),
        }
    }
}

/// The first pause before `landed` asks a stream leader that answered from before a write
/// again.
const STALE_LEADER_PAUSE: Duration = Duration::from_millis(50);

/// Before the next round after a refused write: none after an outdated revision (read
/// again at once, from the leader), a pause growing from 10 ms to 320 ms while another
/// write of the key is in flight (16 rounds wait 3.8 s at most).
pub(super) async fn pause_after(refused: Refused, round: usize) {
    if refused == Refused::InFlight {
        tokio::time::sleep(std::time::Duration::from_millis(10 << round.min(5))).await;
    }
}

/// The answer when every compare-and-set round on `what` `name` was refused: 409 when
/// other writers kept winning, 503 (retry shortly) when NATS kept holding another write of
/// it in flight — a stream leader change, not a conflict.
pub(super) fn gave_up(what: &str, name: &str, last: Option<Refused>) -> OjsError {
    match last {
        Some(Refused::InFlight) => OjsError::new(
            ErrorCode::BackendUnavailable,
            format!("NATS kept another write of {what} '{name}' in flight; retry shortly."),
        ),
        _ => OjsError::new(
            ErrorCode::Conflict,
            format!("The {what} '{name}' is changing too fast; retry."),
        ),
    }
}

/// A JSON entry as last written: `None` when never written, deleted or purged, with the
/// revision its compare-and-set names.
#[derive(Debug, Clone)]
pub(super) struct Current<T> {
    pub(super) value: Option<T>,
    pub(super) revision: u64,
}

/// Reads the JSON entry `what` at `key`.
pub(super) async fn read<T: DeserializeOwned>(
    kv: &kv::Store,
    key: &str,
    from: Replica,
    what: &str,
) -> Result<Current<T>, OjsError> {
    let Some(last) = last(kv, key, from, &format!("reading a {what}")).await? else {
        return Ok(Current {
            value: None,
            revision: 0,
        });
    };
    let value = match last.value {
        Some(bytes) => Some(serde_json::from_slice(&bytes).map_err(|err| {
            OjsError::backend(format!("The {what} at '{key}' is unreadable.")).with_source(err)
        })?),
        None => None,
    };
    Ok(Current {
        value,
        revision: last.revision,
    })
}

/// Read, change, write with the revision read; after a refusal the next round reads at
/// the leader. `change` returning `None` writes nothing. Gives the entry as written (or
/// as found, when nothing was written).
///
/// # Errors
/// 409 or 503 ([`gave_up`]) after [`MAX_CAS_ATTEMPTS`] refused rounds, naming `name`.
pub(super) async fn change<T, F>(
    kv: &kv::Store,
    key: &str,
    what: &str,
    name: &str,
    change: F,
) -> Result<Current<T>, OjsError>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(Option<&T>) -> Option<T>,
{
    change_from(kv, key, what, name, None, change).await
}

/// [`change`], its first round starting from `known` — the entry as this process last
/// wrote it — instead of reading it: a writer that is usually the only one saves the read,
/// and a stale `known` only costs a refused write and a round that reads.
///
/// # Errors
/// As [`change`].
pub(super) async fn change_from<T, F>(
    kv: &kv::Store,
    key: &str,
    what: &str,
    name: &str,
    mut known: Option<Current<T>>,
    mut change: F,
) -> Result<Current<T>, OjsError>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(Option<&T>) -> Option<T>,
{
    let doing = format!("writing a {what}");
    let mut raced = None;
    for round in 0..MAX_CAS_ATTEMPTS {
        let current = match known.take() {
            Some(known) => known,
            None => read::<T>(kv, key, Replica::after(raced.is_some()), what).await?,
        };
        let Some(next) = change(current.value.as_ref()) else {
            return Ok(current);
        };
        let bytes = serde_json::to_vec(&next).expect("entries serialize");
        match write(kv, key, bytes.into(), current.revision, &doing).await? {
            Cas::Written(revision) => {
                return Ok(Current {
                    value: Some(next),
                    revision,
                })
            }
            Cas::Refused(why) => {
                raced = Some(why);
                pause_after(why, round).await;
            }
        }
    }
    Err(gave_up(what, name, raced))
}
