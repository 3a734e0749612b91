//! A request's deadline, and NATS steps run again while they fail for a reason NATS heals
//! by itself: a stream without a leader while a cluster elects one, no responders, a
//! timeout, a reconnect in progress (docs/architecture.md §4, "NATS goes away"). Producers
//! and workers then see a slower answer during a node restart, not an error.
//!
//! The deadline travels with the task that serves the request (a task-local, as a tracing
//! span does), so every NATS step of the request shares one budget without each function
//! passing it on. Work outside a request — the leader's services, pull loops — gives each
//! step [`BACKGROUND_PATIENCE`] and then reports the failure to its own loop, as before.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::error::{nats_failed, unanswered};
use crate::domain::error::{ErrorCode, OjsError};

tokio::task_local! {
    /// A cell, so that the handler that reads a client's wait can move the deadline the
    /// middleware set (`wait_on_top`).
    static DEADLINE: Cell<Instant>;
}

/// How long a NATS step outside any request is retried: about one stream leader election
/// (4–8 s measured on three-node clusters), so background work rides through one without
/// a flood of warnings.
pub const BACKGROUND_PATIENCE: Duration = Duration::from_secs(10);

/// How long past its deadline a request runs before [`serve`] cuts it. Every NATS step is
/// cut at the deadline itself, so what remains then is writing the answer.
const OVERRUN: Duration = Duration::from_millis(250);

/// First pause before a step is run again; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
/// Longest pause between two runs of a step: an election ends within this of its end.
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// Runs `work` with `deadline` as the deadline of each NATS step in it.
pub async fn within<F: Future>(deadline: Instant, work: F) -> F::Output {
    DEADLINE.scope(Cell::new(deadline), work).await
}

/// Runs `work` with at most `patience` of the current deadline: a step that need not wait
/// out a whole election (a best-effort read, a lane a later FETCH may open).
pub async fn patient<F: Future>(patience: Duration, work: F) -> F::Output {
    within(current().min(Instant::now() + patience), work).await
}

/// Serves a request: runs `work` with `deadline` (as [`within`]), and cuts it if it still
/// runs `OVERRUN` past its deadline (moved by [`wait_on_top`] meanwhile), whatever it
/// waits on. A step that escaped the deadline then never holds the client past it.
/// Dropping `work` at an await is what a client closing its connection does too.
///
/// # Errors
/// 503 `backend_unavailable` when the request was cut.
pub async fn serve<F: Future>(deadline: Instant, work: F) -> Result<F::Output, OjsError> {
    within(deadline, async {
        tokio::pin!(work);
        loop {
            let cut_at = current() + OVERRUN;
            match tokio::time::timeout_at(cut_at, &mut work).await {
                Ok(answer) => return Ok(answer),
                // The handler moved the deadline later meanwhile.
                Err(_) if current() + OVERRUN > cut_at => {}
                Err(_) => return Err(out_of_time("answering the request")),
            }
        }
    })
    .await
}

/// Moves the current request's deadline `wait` later: a wait the client asked for (a
/// FETCH's `wait_ms`, a PUSH's block timeout) comes on top of the request's own time.
/// Returns the new deadline.
pub fn wait_on_top(wait: Duration) -> Instant {
    DEADLINE
        .try_with(|d| {
            d.set(d.get() + wait);
            d.get()
        })
        .unwrap_or_else(|_| current() + wait)
}

/// The deadline of the request this task serves; outside a request, [`BACKGROUND_PATIENCE`]
/// from now.
pub fn current() -> Instant {
    DEADLINE
        .try_with(Cell::get)
        .unwrap_or_else(|_| Instant::now() + BACKGROUND_PATIENCE)
}

/// What NATS answered to a step, once it answered.
pub(super) struct Answered<T, E> {
    pub(super) said: Result<T, E>,
    /// Whether an earlier run of the step went unanswered: it may have landed (a write
    /// whose answer was lost), which a write refused now must look into.
    pub(super) after_silence: bool,
}

/// Runs `step` until NATS answers it, by the deadline: again after a pause while it fails
/// for a reason NATS heals by itself (`unanswered`); no run starts or outlasts the
/// deadline. A step run again must be safe to repeat; a write that may have landed is
/// flagged (`after_silence`).
///
/// # Errors
/// 503 `backend_unavailable` (with `Retry-After`) when the deadline passes first.
pub(super) async fn answered<T, E, Fut>(
    doing: &str,
    mut step: impl FnMut() -> Fut,
) -> Result<Answered<T, E>, OjsError>
where
    Fut: Future<Output = Result<T, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let deadline = current();
    let mut pause = FIRST_PAUSE;
    let mut after_silence = false;
    loop {
        let Ok(said) = tokio::time::timeout_at(deadline, step()).await else {
            return Err(out_of_time(doing));
        };
        match said {
            Err(err) if unanswered(&err) => {
                // A random part, so that the requests an election held up do not all come
                // back at the same instant.
                let wait = pause.mul_f64(rand::random_range(0.5..1.0));
                if Instant::now() + wait >= deadline {
                    return Err(nats_failed(doing, err));
                }
                after_silence = true;
                tokio::time::sleep(wait).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
            said => {
                return Ok(Answered {
                    said,
                    after_silence,
                })
            }
        }
    }
}

/// Runs `work`, a best-effort step whose failure a sweep repairs (a give-back after a
/// refusal), no later than the deadline: `None` when the deadline cut it. A request never
/// outlasts its deadline to tidy up.
pub(super) async fn by_deadline<F: Future>(work: F) -> Option<F::Output> {
    tokio::time::timeout_at(current(), work).await.ok()
}

/// The failure of a step that NATS had not answered when the deadline came.
pub(super) fn out_of_time(doing: &str) -> OjsError {
    OjsError::new(
        ErrorCode::BackendUnavailable,
        format!("NATS did not answer in time while {doing}."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_step_nats_did_not_answer_runs_again_until_answered() {
        let runs = AtomicUsize::new(0);
        let answer = within(Instant::now() + Duration::from_secs(10), async {
            answered("writing", || async {
                match runs.fetch_add(1, Ordering::SeqCst) {
                    0 | 1 => Err(PublishError::new(PublishErrorKind::StreamNotFound)),
                    _ => Ok(7),
                }
            })
            .await
        })
        .await
        .unwrap();
        assert_eq!(answer.said.unwrap(), 7);
        assert!(answer.after_silence);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_is_a_refusal_is_not_run_again() {
        let runs = AtomicUsize::new(0);
        let answer = answered("writing", || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(PublishError::new(PublishErrorKind::WrongLastSequence))
        })
        .await
        .unwrap();
        assert!(answer.said.is_err());
        assert!(!answer.after_silence);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_past_the_deadline_is_unavailable_and_ends_at_the_deadline() {
        let start = Instant::now();
        let err = within(start + Duration::from_secs(2), async {
            answered("writing", || async {
                Err::<(), _>(PublishError::new(PublishErrorKind::StreamNotFound))
            })
            .await
        })
        .await
        .err()
        .unwrap();
        assert_eq!(err.code, ErrorCode::BackendUnavailable);
        assert!(start.elapsed() <= Duration::from_secs(2));
        // A step that never answers is cut at the deadline.
        let start = Instant::now();
        let err = within(start + Duration::from_secs(3), async {
            answered("reading", || {
                std::future::pending::<Result<(), PublishError>>()
            })
            .await
        })
        .await
        .err()
        .unwrap();
        assert_eq!(err.code, ErrorCode::BackendUnavailable);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_still_running_past_its_deadline_is_cut() {
        let start = Instant::now();
        // A wait no deadline reaches, as a step that escaped it would be.
        let served = serve(start + Duration::from_secs(10), async {
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
        .await;
        assert_eq!(served.err().unwrap().code, ErrorCode::BackendUnavailable);
        assert_eq!(start.elapsed(), Duration::from_secs(10) + OVERRUN);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_the_client_asked_for_comes_on_top_of_the_deadline() {
        let start = Instant::now();
        let served = serve(start + Duration::from_secs(10), async {
            let deadline = wait_on_top(Duration::from_secs(5));
            assert_eq!(deadline, start + Duration::from_secs(15));
            assert_eq!(current(), deadline);
            tokio::time::sleep(Duration::from_secs(14)).await;
            7
        })
        .await;
        assert_eq!(served.unwrap(), 7);
        assert_eq!(start.elapsed(), Duration::from_secs(14));
    }

    #[tokio::test(start_paused = true)]
    async fn patience_shortens_the_deadline_and_never_lengthens_it() {
        let start = Instant::now();
        within(start + Duration::from_secs(10), async {
            patient(Duration::from_secs(1), async {
                assert_eq!(current(), start + Duration::from_secs(1));
            })
            .await;
            patient(Duration::from_secs(60), async {
                assert_eq!(current(), start + Duration::from_secs(10));
            })
            .await;
        })
        .await;
    }
}
