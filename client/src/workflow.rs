//! Workflows for the client (workflows spec): `chain`, `group` and `batch` of jobs, nested
//! as deep as the server allows, sent as the typed request form.
//!
//! ```
//! use ojs_client::workflow::{batch, chain, group, Callbacks};
//! use ojs_client::JobSpec;
//! use serde_json::json;
//!
//! let flow = chain([
//!     JobSpec::new("order.validate", json!([{"order_id": "o-1"}])).into(),
//!     group([JobSpec::new("export.csv", json!([])), JobSpec::new("export.pdf", json!([]))]),
//!     batch(
//!         [JobSpec::new("email.send", json!(["a@example.com"]))],
//!         Callbacks::default().on_complete(JobSpec::new("report", json!([]))),
//!     ),
//! ])
//! .named("order-pipeline");
//! assert_eq!(flow.to_body()["steps"][1]["type"], "group");
//! ```

use serde_json::{json, Map, Value};

use crate::JobSpec;

/// A workflow, or one job in it.
#[derive(Debug, Clone, PartialEq)]
pub enum Flow {
    Job(JobSpec),
    Chain {
        name: String,
        steps: Vec<Flow>,
    },
    Group {
        name: String,
        jobs: Vec<Flow>,
    },
    Batch {
        name: String,
        jobs: Vec<Flow>,
        callbacks: Box<Callbacks>,
    },
}

/// A batch's callbacks, each enqueued once when every member has ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Callbacks {
    on_complete: Option<JobSpec>,
    on_success: Option<JobSpec>,
    on_failure: Option<JobSpec>,
}

impl Callbacks {
    /// Runs whatever the members' outcome.
    #[must_use]
    pub fn on_complete(mut self, job: JobSpec) -> Callbacks {
        self.on_complete = Some(job);
        self
    }

    /// Runs when every member completed.
    #[must_use]
    pub fn on_success(mut self, job: JobSpec) -> Callbacks {
        self.on_success = Some(job);
        self
    }

    /// Runs when any member failed.
    #[must_use]
    pub fn on_failure(mut self, job: JobSpec) -> Callbacks {
        self.on_failure = Some(job);
        self
    }

    fn each_mut(&mut self) -> impl Iterator<Item = &mut JobSpec> {
        [
            &mut self.on_complete,
            &mut self.on_success,
            &mut self.on_failure,
        ]
        .into_iter()
        .flatten()
    }
}

impl From<JobSpec> for Flow {
    fn from(job: JobSpec) -> Flow {
        Flow::Job(job)
    }
}

/// Steps one after another, each receiving the results of those before it.
pub fn chain<F: Into<Flow>>(steps: impl IntoIterator<Item = F>) -> Flow {
    Flow::Chain {
        name: String::new(),
        steps: steps.into_iter().map(Into::into).collect(),
    }
}

/// Jobs side by side.
pub fn group<F: Into<Flow>>(jobs: impl IntoIterator<Item = F>) -> Flow {
    Flow::Group {
        name: String::new(),
        jobs: jobs.into_iter().map(Into::into).collect(),
    }
}

/// Jobs side by side, then the callbacks their outcome calls for.
pub fn batch<F: Into<Flow>>(jobs: impl IntoIterator<Item = F>, callbacks: Callbacks) -> Flow {
    Flow::Batch {
        name: String::new(),
        jobs: jobs.into_iter().map(Into::into).collect(),
        callbacks: Box::new(callbacks),
    }
}

impl Flow {
    /// Names the workflow (a job's name is its type).
    #[must_use]
    pub fn named(mut self, workflow_name: &str) -> Flow {
        if let Flow::Chain { name, .. } | Flow::Group { name, .. } | Flow::Batch { name, .. } =
            &mut self
        {
            *name = workflow_name.to_owned();
        }
        self
    }

    /// The `POST /ojs/v1/workflows` body.
    pub fn to_body(&self) -> Value {
        let members = |flows: &[Flow]| flows.iter().map(Flow::to_body).collect::<Vec<_>>();
        match self {
            Flow::Job(job) => job.to_body(),
            Flow::Chain { name, steps } => {
                json!({"type": "chain", "name": name, "steps": members(steps)})
            }
            Flow::Group { name, jobs } => {
                json!({"type": "group", "name": name, "jobs": members(jobs)})
            }
            Flow::Batch {
                name,
                jobs,
                callbacks,
            } => {
                let mut cbs = Map::new();
                for (key, job) in [
                    ("on_complete", &callbacks.on_complete),
                    ("on_success", &callbacks.on_success),
                    ("on_failure", &callbacks.on_failure),
                ] {
                    if let Some(job) = job {
                        cbs.insert(key.to_owned(), job.to_body());
                    }
                }
                json!({"type": "batch", "name": name, "jobs": members(jobs), "callbacks": cbs})
            }
        }
    }

    /// Every job of the tree, callbacks included, so the enqueue chain can see each.
    pub(super) fn jobs_mut(&mut self) -> Vec<&mut JobSpec> {
        match self {
            Flow::Job(job) => vec![job],
            Flow::Chain { steps: flows, .. } | Flow::Group { jobs: flows, .. } => {
                flows.iter_mut().flat_map(Flow::jobs_mut).collect()
            }
            Flow::Batch {
                jobs, callbacks, ..
            } => {
                let mut all: Vec<&mut JobSpec> = jobs.iter_mut().flat_map(Flow::jobs_mut).collect();
                all.extend(callbacks.each_mut());
                all
            }
        }
    }
}
