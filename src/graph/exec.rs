//! Runs a graph on one rank: compute ops as kernels on the rank's device,
//! collectives issued asynchronously on its communicator, and each
//! `wait_tensor` as the fence wait on the collective's `Work`. Between a
//! collective and its wait, the compute the schedule put there runs while
//! the ring does; the timeline shows it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write;
use std::rc::Rc;
use std::time::Instant;

use super::ir::{Graph, Node, NodeId, Op};
use crate::Communicator;
use crate::graph::compute::{self, Elementwise};
use crate::{Error, Result};
use crate::{Tensor, Work};

/// Which lane of the timeline an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Kernels of compute ops.
    Compute,
    /// A collective, from its issue to the end of its wait.
    Comm,
}

/// One span of the timeline, in microseconds from the start of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The node, as the printer names it (`%4 all_reduce`).
    pub name: String,
    /// The node's id (the collective's, for a communication span).
    pub node: NodeId,
    /// For a communication span, how long its wait blocked at its end:
    /// when more than zero, the span ends when the collective did, so it
    /// is the collective's own duration (what calibration uses).
    pub blocked_us: f64,
    /// Compute or communication.
    pub lane: Lane,
    /// Start.
    pub start_us: f64,
    /// End.
    pub end_us: f64,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Run {
    /// The graph's outputs, in order.
    pub outputs: Vec<Tensor>,
    /// Compute and communication spans (empty unless asked for).
    pub timeline: Vec<Event>,
    /// Microseconds spent blocked in waits: communication compute did not hide.
    pub exposed_us: f64,
}

/// A collective in flight, shared by the `getitem`s of a coalesced one.
struct Pending {
    work: Option<Work>,
    results: Option<Vec<Tensor>>,
    issued: f64,
    name: String,
    node: NodeId,
}

#[derive(Clone)]
enum Value {
    Ready(Tensor),
    Pending(Rc<RefCell<Pending>>, usize),
}

fn missing(rank: usize, what: String) -> Error {
    Error::InvalidArgument {
        rank: Some(rank),
        what,
    }
}

/// Runs `g` on this rank with the named `inputs`. With `timeline`, each
/// compute op is waited for so that its span is its real duration.
///
/// First the ranks agree that their graphs issue the same collectives (one
/// small all_gather): if not, every rank fails with [`Error::Mismatch`]
/// naming the first collective that differs and this rank's pass pipeline,
/// before any of the graph's collectives is issued.
pub fn execute(
    g: &Graph,
    comm: &Communicator,
    inputs: &[(&str, Tensor)],
    timeline: bool,
) -> Result<Run> {
    execute_on(g, &[comm], inputs, timeline)
}

/// [`execute`] with process groups: a collective traced on group k runs
/// on `groups[k]` (say the rank's communicator, then its row's and its
/// column's from `split`). `groups[0]` runs the agreement and is the
/// rank's whole group; every communicator must be this rank's, on its
/// device.
pub fn execute_on(
    g: &Graph,
    groups: &[&Communicator],
    inputs: &[(&str, Tensor)],
    timeline: bool,
) -> Result<Run> {
    let Some(&comm) = groups.first() else {
        return Err(Error::InvalidArgument {
            rank: None,
            what: "execute_on needs at least one communicator".into(),
        });
    };
    let rank = comm.rank();
    if let Some(n) = g.collectives().find(|n| n.group >= groups.len()) {
        return Err(missing(
            rank,
            format!(
                "%{} runs on process group {}, but {} communicators were given",
                n.id,
                n.group,
                groups.len()
            ),
        ));
    }
    super::agree::agree(g, comm)?;
    let start = Instant::now();
    let now = || start.elapsed().as_secs_f64() * 1e6;
    let mut values: HashMap<NodeId, Value> = HashMap::new();
    let mut events = Vec::new();
    let mut outputs = Vec::new();
    let mut exposed_us = 0.0;
    for n in &g.nodes {
        let ready = |id: NodeId| -> Result<Tensor> {
            match values.get(&id) {
                Some(Value::Ready(t)) => Ok(t.clone()),
                Some(Value::Pending(..)) => Err(missing(
                    rank,
                    format!("%{} reads %{id} before its wait_tensor", n.id),
                )),
                None => Err(missing(
                    rank,
                    format!("%{} reads %{id}, which has no value", n.id),
                )),
            }
        };
        let arg =
            |i: usize| -> Result<Tensor> { ready(n.args.get(i).copied().unwrap_or(usize::MAX)) };
        let shape_of = |i: usize| -> Vec<usize> {
            n.args
                .get(i)
                .and_then(|&a| g.node(a))
                .map(|a| a.shape.clone())
                .unwrap_or_default()
        };
        let t0 = now();
        let compute = |t: Result<Tensor>| -> Result<Value> { t.map(Value::Ready) };
        let value = match &n.op {
            Op::Input(name) => {
                let t = inputs
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, t)| t.clone())
                    .ok_or_else(|| missing(rank, format!("no input named {name:?}")))?;
                if t.len() != n.len() {
                    return Err(missing(
                        rank,
                        format!(
                            "input {name:?} has {} elements, the graph expects {:?}",
                            t.len(),
                            n.shape
                        ),
                    ));
                }
                Some(Value::Ready(t))
            }
            Op::Output => {
                outputs = n.args.iter().map(|&a| ready(a)).collect::<Result<_>>()?;
                None
            }
            Op::Matmul {
                transpose_a,
                transpose_b,
            } => {
                let sa = shape_of(0);
                let (m, k) = if *transpose_a {
                    (sa[1], sa[0])
                } else {
                    (sa[0], sa[1])
                };
                let nn = n.shape.get(1).copied().unwrap_or(0);
                Some(compute(compute::matmul(
                    &arg(0)?,
                    &arg(1)?,
                    m,
                    k,
                    nn,
                    *transpose_a,
                    *transpose_b,
                ))?)
            }
            Op::Add | Op::Sub | Op::Mul | Op::ReluGrad => {
                let e = match n.op {
                    Op::Add => Elementwise::Add,
                    Op::Sub => Elementwise::Sub,
                    Op::Mul => Elementwise::Mul,
                    _ => Elementwise::ReluGrad,
                };
                Some(compute(compute::elementwise(e, &arg(0)?, &arg(1)?, 0.0))?)
            }
            Op::Scale(f) => {
                let a = arg(0)?;
                Some(compute(compute::elementwise(
                    Elementwise::Scale,
                    &a,
                    &a,
                    *f,
                ))?)
            }
            Op::Relu => {
                let a = arg(0)?;
                Some(compute(compute::elementwise(
                    Elementwise::Relu,
                    &a,
                    &a,
                    0.0,
                ))?)
            }
            Op::SumRows => {
                let s = shape_of(0);
                Some(compute(compute::sum_rows(
                    &arg(0)?,
                    s[0],
                    s.get(1).copied().unwrap_or(1),
                ))?)
            }
            Op::Reshape => Some(Value::Ready(arg(0)?)),
            Op::Concat => {
                let parts = (0..n.args.len()).map(arg).collect::<Result<Vec<_>>>()?;
                Some(Value::Ready(compute::concat(&parts, n.len())?))
            }
            Op::Split { parts, index } => {
                let a = arg(0)?;
                let len = a.len().checked_div(*parts).unwrap_or(0);
                let start = index.checked_mul(len).ok_or_else(|| {
                    missing(rank, format!("split part {index} of {len} overflows"))
                })?;
                Some(Value::Ready(compute::slice(&a, start, len)?))
            }
            op if op.is_collective() => {
                let work = issue(
                    groups.get(n.group).copied().unwrap_or(comm),
                    n,
                    &n.args
                        .iter()
                        .map(|&a| ready(a))
                        .collect::<Result<Vec<_>>>()?,
                )?;
                let p = Pending {
                    work: Some(work),
                    results: None,
                    issued: t0,
                    name: format!("%{} {}", n.id, n.op.name()),
                    node: n.id,
                };
                Some(Value::Pending(Rc::new(RefCell::new(p)), 0))
            }
            Op::Item(i) => match values.get(&n.args[0]) {
                Some(Value::Pending(p, _)) => Some(Value::Pending(p.clone(), *i)),
                _ => {
                    return Err(missing(
                        rank,
                        format!(
                            "getitem %{} of %{}, which is no collective",
                            n.id, n.args[0]
                        ),
                    ));
                }
            },
            Op::WaitTensor => {
                let Some(Value::Pending(p, i)) = values.get(&n.args[0]).cloned() else {
                    return Err(missing(
                        rank,
                        format!(
                            "wait_tensor %{} on %{}, which is no collective result",
                            n.id, n.args[0]
                        ),
                    ));
                };
                let mut p = p.borrow_mut();
                if p.results.is_none() {
                    let work = p
                        .work
                        .take()
                        .ok_or_else(|| missing(rank, format!("%{} waited twice", n.id)))?;
                    let finished = work.is_completed();
                    let blocked = now();
                    p.results = Some(work.wait_all()?);
                    let end = now();
                    exposed_us += end - blocked;
                    if timeline {
                        events.push(Event {
                            name: p.name.clone(),
                            node: p.node,
                            blocked_us: if finished { 0.0 } else { end - blocked },
                            lane: Lane::Comm,
                            start_us: p.issued,
                            end_us: now(),
                        });
                    }
                }
                let t = p
                    .results
                    .as_ref()
                    .and_then(|r| r.get(i))
                    .cloned()
                    .ok_or_else(|| missing(rank, format!("%{} has no result {i}", n.args[0])))?;
                Some(Value::Ready(t))
            }
            op => {
                return Err(missing(
                    rank,
                    format!("the executor cannot run {}", op.name()),
                ));
            }
        };
        if timeline
            && !n.op.is_collective()
            && !matches!(
                n.op,
                Op::WaitTensor | Op::Input(_) | Op::Output | Op::Item(_) | Op::Reshape
            )
        {
            comm.synchronize()?;
            events.push(Event {
                name: format!("%{} {}", n.id, n.op.name()),
                node: n.id,
                blocked_us: 0.0,
                lane: Lane::Compute,
                start_us: t0,
                end_us: now(),
            });
        }
        if let Some(v) = value {
            values.insert(n.id, v);
        }
    }
    Ok(Run {
        outputs,
        timeline: events,
        exposed_us,
    })
}

fn issue(comm: &Communicator, n: &Node, args: &[Tensor]) -> Result<Work> {
    let Some(x) = args.first() else {
        return Err(missing(comm.rank(), format!("%{} has no input", n.id)));
    };
    match n.op {
        Op::AllReduce(op) => comm.all_reduce(x, op),
        Op::AllGather => comm.all_gather(x),
        Op::ReduceScatter(op) => comm.reduce_scatter(x, op),
        Op::Broadcast(root) => comm.broadcast(x, root),
        Op::AllToAll => comm.all_to_all(x, None, None),
        Op::AllToAllV { ref send, ref recv } => comm.all_to_all(x, Some(send), Some(recv)),
        Op::Reduce(op, root) => comm.reduce(x, op, root),
        Op::AllReduceInPlace(op) => comm.all_reduce_in_place(x, op),
        Op::AllReduceCoalesced(op) => comm.all_reduce_coalesced(args, op),
        Op::AllGatherCoalesced => comm.all_gather_coalesced(args),
        Op::ReduceScatterCoalesced(op) => comm.reduce_scatter_coalesced(args, op),
        _ => Err(missing(comm.rank(), format!("%{} is no collective", n.id))),
    }
}

/// Every rank's timeline as Chrome trace-event JSON (open it in Perfetto):
/// one process per rank, a thread for compute and one for communication.
pub fn chrome_trace(ranks: &[(usize, &[Event])]) -> String {
    let mut s = String::from("{\"traceEvents\": [\n");
    let mut first = true;
    for (rank, events) in ranks {
        for e in *events {
            if !first {
                s.push_str(",\n");
            }
            first = false;
            let tid = match e.lane {
                Lane::Compute => 0,
                Lane::Comm => 1,
            };
            let _ = write!(
                s,
                "  {{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {:.3}, \"dur\": {:.3}, \"pid\": {rank}, \"tid\": {tid}}}",
                e.name.replace('"', "'"),
                if tid == 0 { "compute" } else { "comm" },
                e.start_us,
                (e.end_us - e.start_us).max(0.0)
            );
        }
    }
    s.push_str("\n]}\n");
    s
}
