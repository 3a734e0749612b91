//! Workflows (workflows spec; http-api §3.7, §4.12): what a creation request asks for, the
//! record that holds a workflow's progress, and how a member's outcome moves it on. No I/O:
//! the store creates what [`plan`] lists and the leader stores what [`apply`] decides
//! (architecture §3.16).
//!
//! A workflow is a tree: a chain, group or batch whose members are jobs or further
//! workflows. Every id in the tree is derived from the root's id and the member's place,
//! so doing the same step again after a crash names the same job.

mod layout;
mod progress;
mod record;
mod request;

pub use layout::{plan, Creation};
pub use progress::*;
pub use record::*;
pub use request::{parse, Member, MemberRequest, Request};

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use serde_json::{json, Value};
    use uuid::Uuid;

    use super::*;
    use crate::domain::error::ErrorCode;
    use crate::domain::job::{Callback, Slot};
    use crate::domain::retry::OnExhaustion;
    use crate::domain::state::JobState;

    fn now() -> DateTime<Utc> {
        "2026-11-25T10:00:00Z".parse().unwrap()
    }

    fn job(t: &str) -> Value {
        json!({"type": t, "args": [], "options": {"queue": "wf"}})
    }

    fn laid_out(body: Value) -> Creation {
        let id = Uuid::parse_str("01967a3e-0000-7000-8000-000000000001").unwrap();
        plan(&parse(body).unwrap(), id, now(), OnExhaustion::Discard).unwrap()
    }

    fn states(c: &Creation) -> Vec<(String, JobState)> {
        c.jobs
            .iter()
            .map(|(j, _)| (j.job_type.clone(), j.state))
            .collect()
    }

    fn refused(body: Value) -> String {
        let err = parse(body.clone())
            .and_then(|r| plan(&r, Uuid::now_v7(), now(), OnExhaustion::Discard))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRequest, "{body}");
        err.message
    }

    #[test]
    fn a_chain_starts_its_first_step_and_holds_the_others() {
        let c = laid_out(
            json!({"type": "chain", "name": "c", "steps": [job("a"), job("b"), job("c")]}),
        );
        assert_eq!(
            states(&c),
            [
                ("a".into(), JobState::Available),
                ("b".into(), JobState::Pending),
                ("c".into(), JobState::Pending)
            ]
        );
        let (rec, plan) = &c.workflows[0];
        assert_eq!(
            (rec.kind, rec.status.as_str(), rec.ready),
            (Kind::Chain, "pww", false)
        );
        assert_eq!(plan.types, ["a", "b", "c"]);
        for (i, (j, slot)) in c.jobs.iter().enumerate() {
            assert_eq!(j.id, rec.member_id(i));
            assert_eq!(j.workflow_id.as_deref(), Some(rec.id.as_str()));
            assert_eq!(*slot, Slot::Member(i));
        }
        // The same request under the same id lays out the same ids.
        let again = laid_out(
            json!({"type": "chain", "name": "c", "steps": [job("a"), job("b"), job("c")]}),
        );
        assert_eq!(c.jobs[2].0.id, again.jobs[2].0.id);
    }

    #[test]
    fn groups_and_batches_start_every_member_and_hold_the_callbacks() {
        let c = laid_out(json!({"type": "batch", "jobs": [job("a"), job("b")],
            "callbacks": {"on_failure": job("f"), "on_complete": job("done")}}));
        assert_eq!(
            states(&c),
            [
                ("a".into(), JobState::Available),
                ("b".into(), JobState::Available),
                ("done".into(), JobState::Pending),
                ("f".into(), JobState::Pending)
            ]
        );
        assert_eq!(c.jobs[3].1, Slot::Callback(Callback::OnFailure));
        assert_eq!(
            c.workflows[0].0.callbacks,
            [(Callback::OnComplete, 'w'), (Callback::OnFailure, 'w')]
        );
        // Either list name is read for any kind.
        let g = laid_out(json!({"type": "group", "steps": [job("a")]}));
        assert_eq!(g.workflows[0].0.status, "p");
    }

    #[test]
    fn a_nested_chain_starts_with_its_group_and_holds_its_later_steps() {
        let c = laid_out(json!({"type": "group", "jobs": [
            job("solo"),
            {"type": "chain", "steps": [job("s0"), job("s1")]}
        ]}));
        assert_eq!(c.workflows.len(), 2);
        let (root, child) = (&c.workflows[0].0, &c.workflows[1].0);
        assert_eq!(root.nested, [1]);
        assert_eq!(child.id, root.member_id(1));
        assert_eq!(
            child.parent,
            Some(ParentRef {
                workflow_id: root.id.clone(),
                index: 1
            })
        );
        assert_eq!(c.workflows[0].1.types, ["solo", "chain"]);
        assert_eq!(
            states(&c),
            [
                ("solo".into(), JobState::Available),
                ("s0".into(), JobState::Available),
                ("s1".into(), JobState::Pending)
            ]
        );
        assert_eq!(c.jobs[1].0.workflow_id.as_deref(), Some(child.id.as_str()));
        // A group that is a later chain step waits with all of its jobs.
        let c = laid_out(json!({"type": "chain", "steps": [
            job("first"), {"type": "group", "jobs": [job("g0"), job("g1")]}]}));
        assert_eq!(c.workflows[1].0.status, "ww");
        assert!(c.jobs[1..]
            .iter()
            .all(|(j, _)| j.state == JobState::Pending));
    }

    #[test]
    fn top_level_options_are_every_jobs_defaults() {
        let r = parse(json!({"steps": [
            {"id": "job-0", "type": "t.a", "args": []},
            {"id": "job-1", "type": "t.b", "args": [], "options": {"queue": "own"}},
            {"id": "on-complete", "type": "t.cb", "args": [], "depends_on": ["job-0", "job-1"]}],
            "options": {"queue": "exports", "priority": 5}}))
        .unwrap();
        let options = |job: &Value| job["options"].clone();
        let Member::Job(first) = &r.members[0].what else {
            panic!("a job")
        };
        let Member::Job(second) = &r.members[1].what else {
            panic!("a job")
        };
        assert_eq!(options(first), json!({"queue": "exports", "priority": 5}));
        assert_eq!(options(second), json!({"queue": "own", "priority": 5}));
        assert_eq!(options(&r.callbacks[0].1)["queue"], "exports");
        let typed = parse(
            json!({"type": "chain", "options": {"queue": "q"}, "steps": [
            {"type": "group", "jobs": [{"type": "t", "args": []}]}]}),
        )
        .unwrap();
        let Member::Workflow(inner) = &typed.members[0].what else {
            panic!("a group")
        };
        let Member::Job(leaf) = &inner.members[0].what else {
            panic!("a job")
        };
        assert_eq!(leaf["options"]["queue"], "q");
        assert!(refused(
            json!({"type": "chain", "options": 3, "steps": [{"type": "t", "args": []}]})
        )
        .contains("options"));
        // Copied into every job, so bounded in all: 10,000 jobs times 2 KB is refused.
        let jobs: Vec<Value> = (0..10_000)
            .map(|_| json!({"type": "t", "args": []}))
            .collect();
        let big = json!({"type": "group", "jobs": jobs, "options": {"note": "x".repeat(2048)}});
        assert!(refused(big).contains("copied"));
    }

    #[test]
    fn the_step_graph_form_reads_as_a_chain_a_group_or_a_batch() {
        let step = |id: &str, deps: &[&str]| json!({"id": id, "type": format!("t.{id}"), "args": [], "depends_on": deps});
        let chain = parse(json!({"name": "g", "steps": [step("step-1", &["step-0"]), step("step-0", &[]), step("step-2", &["step-1"])]})).unwrap();
        assert_eq!(chain.kind, Kind::Chain);
        let order: Vec<_> = chain
            .members
            .iter()
            .map(|m| m.step_id.clone().unwrap())
            .collect();
        assert_eq!(order, ["step-0", "step-1", "step-2"]);
        let group = parse(json!({"steps": [step("job-0", &[]), step("job-1", &[])]})).unwrap();
        assert_eq!(group.kind, Kind::Group);
        let batch = parse(json!({"steps": [step("job-0", &[]), step("job-1", &[]),
            {"id": "cb", "type": "t.cb", "args": [], "depends_on": ["job-0", "job-1"],
             "options": {"callback_type": "on_complete", "queue": "cbq"}}]}))
        .unwrap();
        assert_eq!(batch.kind, Kind::Batch);
        assert_eq!(batch.callbacks[0].0, Callback::OnComplete);
        assert_eq!(batch.callbacks[0].1["options"], json!({"queue": "cbq"}));
        // The Rust client's batch: callbacks named for their type, after every job.
        let named = parse(json!({"steps": [step("job-0", &[]), step("job-1", &[]),
            step("on-failure", &["job-1", "job-0"]), step("on-complete", &["job-0", "job-1"])]}))
        .unwrap();
        assert_eq!(named.kind, Kind::Batch);
        assert_eq!(named.jobs(), 2);
        let types: Vec<_> = named.callbacks.iter().map(|(c, _)| *c).collect();
        assert_eq!(types, [Callback::OnComplete, Callback::OnFailure]);
        let one =
            parse(json!({"steps": [step("job-0", &[]), step("on-failure", &["job-0"])]})).unwrap();
        assert_eq!(
            (one.kind, one.callbacks[0].0),
            (Kind::Batch, Callback::OnFailure)
        );
        // Named so but after only some steps: a plain step (here a chain).
        let chain = parse(json!({"steps": [step("a", &[]), step("on-success", &["a"]),
            step("b", &["on-success"])]}))
        .unwrap();
        assert_eq!((chain.kind, chain.jobs()), (Kind::Chain, 3));
        let diamond = json!({"steps": [step("a", &[]), step("b", &["a"]), step("c", &["a"]), step("d", &["b", "c"])]});
        assert!(refused(diamond).contains("chain"));
        assert!(refused(json!({"steps": [step("a", &["x"])]})).contains("\"x\""));
        assert!(refused(json!({"steps": [step("a", &[]), step("a", &[])]})).contains("twice"));
        let fork = json!({"steps": [step("a", &[]), step("b", &["a"]), step("c", &["a"])]});
        assert!(refused(fork).contains("chain"));
        let cycle = json!({"steps": [step("a", &[]), step("b", &["c"]), step("c", &["b"])]});
        assert!(refused(cycle).contains("chain"));
        // A long chain listed backwards is ordered (in linear time); one step too many is
        // refused before any of it is read.
        let backwards: Vec<Value> = (0..MAX_JOBS)
            .rev()
            .map(|i| {
                let before = if i == 0 {
                    vec![]
                } else {
                    vec![format!("s{}", i - 1)]
                };
                json!({"id": format!("s{i}"), "type": "t", "args": [], "depends_on": before})
            })
            .collect();
        let long = parse(json!({"steps": backwards})).unwrap();
        assert_eq!(long.kind, Kind::Chain);
        assert_eq!(
            long.members[MAX_JOBS - 1].step_id.as_deref(),
            Some(format!("s{}", MAX_JOBS - 1).as_str())
        );
        let many: Vec<Value> = (0..MAX_JOBS + 4)
            .map(|i| json!({"id": i.to_string()}))
            .collect();
        assert!(refused(json!({"steps": many})).contains("at most"));
    }

    #[test]
    fn bad_workflows_are_refused_with_the_place_named() {
        assert!(refused(json!({"type": "chain", "steps": []})).contains("at least one"));
        assert!(refused(json!({"type": "batch", "jobs": [job("a")]})).contains("callback"));
        assert!(refused(
            json!({"type": "group", "jobs": [job("a")], "callbacks": {"on_complete": job("c")}})
        )
        .contains("Only a batch"));
        assert!(refused(json!({"type": "dag", "steps": [job("a")]})).contains("\"dag\""));
        assert!(refused(json!({"type": "chain", "steps": [{"type": "a"}]})).contains("args"));
        assert!(refused(json!({"type": "chain", "steps": [{"type": "a", "args": [], "options": {"scheduled_at": "+PT1S"}}]})).contains("scheduled_at"));
        let deep = json!({"type": "chain", "steps": [{"type": "group", "jobs": [{"type": "chain", "steps": [{"type": "group", "jobs": [job("a")]}]}]}]});
        assert!(refused(deep).contains("3 levels"));
        let many: Vec<Value> = (0..=MAX_JOBS).map(|_| job("a")).collect();
        assert!(refused(json!({"type": "group", "jobs": many})).contains("at most"));
        let err = parse(json!({"type": "chain", "steps": []})).unwrap_err();
        assert_eq!(err.details["validation_errors"][0]["path"], "$.steps");
    }

    fn record(body: Value) -> WorkflowRecord {
        laid_out(body).workflows[0].0.clone()
    }

    #[test]
    fn a_chain_moves_on_once_per_completed_step_and_passes_results() {
        let rec = record(json!({"type": "chain", "steps": [job("a"), job("b")]}));
        let started = apply(&rec, &[(Slot::Member(0), Seen::Started)], now());
        assert_eq!(started.happened, [Happened::Started]);
        assert_eq!(started.record.status, "aw");
        let done = vec![(
            Slot::Member(0),
            Seen::Completed(Some(vec![json!({"r": 1})])),
        )];
        let first = apply(&started.record, &done, now());
        assert_eq!(first.record.status, "cp");
        assert_eq!(
            first.effects,
            [Effect::Activate {
                job_id: rec.member_id(1),
                results: Results::Given(vec![json!({"r": 1})])
            }]
        );
        assert_eq!(first.happened, [Happened::StepCompleted { index: 0 }]);
        // Seen again (a replay after a failover): nothing changes, nothing is started twice.
        let replay = apply(&first.record, &done, now());
        assert!(!replay.changed && replay.effects.is_empty() && replay.happened.is_empty());
        let last = apply(
            &first.record,
            &[(Slot::Member(1), Seen::Completed(None))],
            now(),
        );
        assert_eq!(last.record.state, WorkflowState::Completed);
        assert_eq!(last.record.completed(), 2);
        assert_eq!(
            last.happened,
            [Happened::StepCompleted { index: 1 }, Happened::Completed]
        );
    }

    #[test]
    fn a_failed_chain_step_cancels_the_rest() {
        let rec = record(json!({"type": "chain", "steps": [job("a"), job("b"), job("c")]}));
        let a = apply(
            &rec,
            &[(Slot::Member(0), Seen::Failed(Some(json!({"code": "x"}))))],
            now(),
        );
        assert_eq!(a.record.state, WorkflowState::Failed);
        assert_eq!(a.record.status, "fxx");
        assert_eq!(a.record.failure.as_ref().unwrap().index, 0);
        assert_eq!(
            a.effects,
            [
                Effect::Cancel {
                    job_id: rec.member_id(1)
                },
                Effect::Cancel {
                    job_id: rec.member_id(2)
                }
            ]
        );
        assert_eq!(a.happened, [Happened::Failed { index: Some(0) }]);
    }

    #[test]
    fn a_group_ends_when_its_last_member_does() {
        let rec = record(json!({"type": "group", "jobs": [job("a"), job("b"), job("c")]}));
        let a = apply(
            &rec,
            &[
                (Slot::Member(1), Seen::Failed(None)),
                (Slot::Member(0), Seen::Completed(None)),
            ],
            now(),
        );
        assert_eq!(a.record.state, WorkflowState::Running);
        let b = apply(
            &a.record,
            &[(Slot::Member(2), Seen::Completed(None))],
            now(),
        );
        assert_eq!(b.record.state, WorkflowState::Failed);
        assert_eq!((b.record.completed(), b.record.failed()), (2, 1));
    }

    #[test]
    fn a_batch_fires_the_callbacks_its_outcome_calls_for_once() {
        let body = json!({"type": "batch", "jobs": [job("a"), job("b")],
            "callbacks": {"on_complete": job("c"), "on_success": job("s"), "on_failure": job("f")}});
        let rec = record(body);
        let all = [
            (Slot::Member(0), Seen::Completed(None)),
            (Slot::Member(1), Seen::Failed(None)),
        ];
        let a = apply(&rec, &all, now());
        let id = |c| rec.callback_id(c);
        assert_eq!(
            a.effects,
            [
                Effect::Activate {
                    job_id: id(Callback::OnComplete),
                    results: Results::OfMembers
                },
                Effect::Cancel {
                    job_id: id(Callback::OnSuccess)
                },
                Effect::Activate {
                    job_id: id(Callback::OnFailure),
                    results: Results::OfMembers
                },
            ]
        );
        assert!(apply(&a.record, &all, now()).effects.is_empty());
        let one = apply(
            &a.record,
            &[(Slot::Callback(Callback::OnComplete), Seen::Completed(None))],
            now(),
        );
        assert_eq!(one.record.state, WorkflowState::Running);
        let both = apply(
            &one.record,
            &[(Slot::Callback(Callback::OnFailure), Seen::Completed(None))],
            now(),
        );
        assert_eq!(both.record.state, WorkflowState::Completed);
        // Only on_success, and a member failed: nothing to wait for, the batch failed.
        let only = record(
            json!({"type": "batch", "jobs": [job("a")], "callbacks": {"on_success": job("s")}}),
        );
        let a = apply(&only, &[(Slot::Member(0), Seen::Failed(None))], now());
        assert_eq!(a.record.state, WorkflowState::Failed);
    }

    #[test]
    fn a_nested_workflow_reports_to_its_parent_which_starts_what_follows() {
        let c = laid_out(json!({"type": "chain", "steps": [
            {"type": "group", "jobs": [job("g0")]}, job("after")]}));
        let (root, child) = (&c.workflows[0].0, &c.workflows[1].0);
        let a = apply(child, &[(Slot::Member(0), Seen::Completed(None))], now());
        assert_eq!(
            a.effects,
            [Effect::Report {
                parent: ParentRef {
                    workflow_id: root.id.clone(),
                    index: 0
                },
                seen: Seen::Completed(None)
            }]
        );
        let up = apply(root, &[(Slot::Member(0), Seen::Completed(None))], now());
        assert_eq!(
            up.effects,
            [Effect::Activate {
                job_id: root.member_id(1),
                results: Results::None
            }]
        );
        // A nested workflow waiting as a later step is begun, not activated.
        let c = laid_out(
            json!({"type": "chain", "steps": [job("first"), {"type": "group", "jobs": [job("g")]}]}),
        );
        let root = &c.workflows[0].0;
        let a = apply(
            root,
            &[(Slot::Member(0), Seen::Completed(Some(vec![json!("r0")])))],
            now(),
        );
        assert_eq!(
            a.effects,
            [Effect::Begin {
                workflow_id: root.member_id(1),
                results: Some(vec![json!("r0")])
            }]
        );
        let child = &c.workflows[1].0;
        let begun = begin(child, Some(vec![json!("r0")]));
        assert_eq!(begun.record.status, "p");
        assert_eq!(begun.record.received, Some(vec![json!("r0")]));
        assert_eq!(
            begun.effects,
            [Effect::Activate {
                job_id: child.member_id(0),
                results: Results::Given(vec![json!("r0")])
            }]
        );
    }

    #[test]
    fn cancel_stops_a_running_workflow_once() {
        let rec = record(json!({"type": "chain", "steps": [job("a"), job("b")]}));
        let a = cancel(&rec, now()).unwrap();
        assert_eq!(a.record.state, WorkflowState::Cancelled);
        assert_eq!(a.record.status, "px");
        assert_eq!(a.effects.len(), 2);
        // The timer's repair after a cancel cut short repeats both cancellations.
        assert_eq!(cancellations(&a.record), a.effects);
        assert_eq!(
            cancel(&a.record, now()).unwrap_err().code,
            ErrorCode::Conflict
        );
        // A member finishing afterwards is recorded and starts nothing.
        let after = apply(
            &a.record,
            &[(Slot::Member(0), Seen::Completed(Some(vec![])))],
            now(),
        );
        assert_eq!(after.record.status, "cx");
        assert!(after.effects.is_empty());
    }
}
