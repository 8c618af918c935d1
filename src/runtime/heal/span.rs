//! Healing across processes: what travels between a world's processes
//! so that process 0 decides for all of them.
//!
//! Over MPI a process sees only its own ranks' calls, and only its own
//! ranks wait on the decisions. So each process times its ranks' part of
//! every call (its first start to its last end) and sends those times to
//! process 0, a batch every [`BATCH`] calls, where a call's time is the
//! slowest process's; process 0's rank 0 decides as it does in one
//! process, and sends each checkpoint it decides (and each change of
//! table or exploration, the table as its text) to every other process,
//! whose ranks wait for it as ranks wait for rank 0 in one process. The
//! words are read as untrusted: a count or a length that does not fit
//! the message drops it.
#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

use std::sync::Arc;

use crate::runtime::fingerprint::Kind;
use crate::runtime::heal::{At, Directive, Explore};
use crate::runtime::plan::Plan;
use crate::runtime::tune::Table;

/// Calls whose times a process sends process 0 at once.
pub(crate) const BATCH: usize = 8;

/// How a world's healing reaches its other processes.
pub(crate) struct Span {
    /// The ranks of this process.
    pub local: usize,
    /// The world's processes.
    pub processes: usize,
    /// Whether this process holds rank 0, which decides.
    pub decides: bool,
    /// Where this process's notes go.
    pub relay: Arc<dyn Relay>,
}

/// How a process's healing notes reach the world's other processes.
pub(crate) trait Relay: Send + Sync {
    /// Sends `words`, a note of run `run`: to every other process when
    /// `to_all`, else to process 0.
    fn send(&self, run: u32, to_all: bool, words: Vec<u8>);
}

/// The notes of group `group`, through this process's MPI hub; once the
/// hub is gone (the world is ending), a note goes nowhere.
#[cfg(feature = "mpi")]
pub(crate) struct OverMpi {
    pub hub: std::sync::Weak<crate::transport::mpi::hub::Hub>,
    pub group: u64,
}

#[cfg(feature = "mpi")]
impl Relay for OverMpi {
    fn send(&self, run: u32, to_all: bool, words: Vec<u8>) {
        if let Some(hub) = self.hub.upgrade() {
            hub.note(self.group, run, to_all, words);
        }
    }
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Span")
            .field("local", &self.local)
            .field("processes", &self.processes)
            .field("decides", &self.decides)
            .finish_non_exhaustive()
    }
}

/// One call as a process saw it: when, what, and its ranks' time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Seen {
    pub at: At,
    pub kind: Kind,
    pub bytes: usize,
    pub plan: Plan,
    pub secs: f64,
}

/// What process 0 decided in a run: every checkpoint up to `upto`, and
/// the changes from the checkpoints named.
#[derive(Debug, Clone)]
pub(crate) struct Decided {
    pub run: u32,
    pub upto: u64,
    pub changes: Vec<(u64, Directive)>,
}

/// A note between processes.
#[derive(Debug, Clone)]
pub(crate) enum Note {
    /// A process's calls, for process 0.
    Seen(Vec<Seen>),
    /// Process 0's decisions, for every other process.
    Decided(Decided),
}

const SEEN: u8 = 1;
const DECIDED: u8 = 2;

fn kind_code(kind: Kind) -> u8 {
    Kind::ALL
        .iter()
        .position(|&k| k == kind)
        .and_then(|i| u8::try_from(i).ok())
        .unwrap_or(u8::MAX)
}

fn plan_code(plan: Plan) -> u8 {
    u8::try_from(Plan::code(Some(plan))).unwrap_or(0)
}

/// Words written little-endian.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

/// Words read back; `None` past the end.
struct In<'a>(&'a [u8]);

impl In<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn kind(&mut self) -> Option<Kind> {
        Kind::ALL.get(usize::from(self.u8()?)).copied()
    }
    fn plan(&mut self) -> Option<Plan> {
        Plan::from_code(u64::from(self.u8()?))
    }
    fn count(&mut self, least_bytes_each: usize) -> Option<usize> {
        // A count the rest of the message cannot hold is a lie.
        let n = usize::try_from(self.u32()?).ok()?;
        (n.checked_mul(least_bytes_each)? <= self.0.len()).then_some(n)
    }
}

impl Note {
    /// Its words on the wire.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut o = Out::default();
        match self {
            Note::Seen(calls) => {
                o.u8(SEEN);
                let n = u32::try_from(calls.len()).unwrap_or(u32::MAX);
                o.u32(n);
                for s in calls.iter().take(usize::try_from(n).unwrap_or(0)) {
                    o.u32(s.at.0);
                    o.u64(s.at.1);
                    o.u8(kind_code(s.kind));
                    o.u64(s.bytes as u64);
                    o.u8(plan_code(s.plan));
                    o.u64(s.secs.to_bits());
                }
            }
            Note::Decided(d) => {
                o.u8(DECIDED);
                o.u32(d.run);
                o.u64(d.upto);
                let n = u32::try_from(d.changes.len()).unwrap_or(u32::MAX);
                o.u32(n);
                for (from, directive) in d.changes.iter().take(usize::try_from(n).unwrap_or(0)) {
                    o.u64(*from);
                    match directive.explore.as_deref() {
                        Some(e) => {
                            o.u8(1);
                            o.u8(kind_code(e.kind));
                            o.u64(e.bytes as u64);
                            let k = u8::try_from(e.plans.len()).unwrap_or(u8::MAX);
                            o.u8(k);
                            for &p in e.plans.iter().take(usize::from(k)) {
                                o.u8(plan_code(p));
                            }
                        }
                        None => o.u8(0),
                    }
                    // A table is a few hundred bytes; one past 4 GiB goes as
                    // none, and the note is refused where it lands.
                    let text = directive.table.to_text("healed");
                    match u32::try_from(text.len()) {
                        Ok(len) => {
                            o.u32(len);
                            o.0.extend_from_slice(text.as_bytes());
                        }
                        Err(_) => o.u32(0),
                    }
                }
            }
        }
        o.0
    }

    /// The note in `words`; `None` when they are not one (whatever their
    /// counts and lengths claim).
    pub(crate) fn decode(words: &[u8]) -> Option<Note> {
        let mut i = In(words);
        let note = match i.u8()? {
            SEEN => {
                let n = i.count(30)?;
                let mut calls = Vec::with_capacity(n);
                for _ in 0..n {
                    let at = (i.u32()?, i.u64()?);
                    let kind = i.kind()?;
                    let bytes = usize::try_from(i.u64()?).ok()?;
                    let plan = i.plan()?;
                    let secs = f64::from_bits(i.u64()?);
                    calls.push(Seen {
                        at,
                        kind,
                        bytes,
                        plan,
                        secs,
                    });
                }
                Note::Seen(calls)
            }
            DECIDED => {
                let run = i.u32()?;
                let upto = i.u64()?;
                let n = i.count(13)?;
                let mut changes = Vec::with_capacity(n);
                for _ in 0..n {
                    let from = i.u64()?;
                    let explore = match i.u8()? {
                        0 => None,
                        1 => {
                            let kind = i.kind()?;
                            let bytes = usize::try_from(i.u64()?).ok()?;
                            let k = usize::from(i.u8()?);
                            let plans = (0..k).map(|_| i.plan()).collect::<Option<Vec<_>>>()?;
                            Some(Arc::new(Explore { kind, bytes, plans }))
                        }
                        _ => return None,
                    };
                    let len = usize::try_from(i.u32()?).ok()?;
                    let text = std::str::from_utf8(i.bytes(len)?).ok()?;
                    let table = Arc::new(Table::from_text(text, None).ok()?);
                    changes.push((from, Directive { table, explore }));
                }
                Note::Decided(Decided { run, upto, changes })
            }
            _ => return None,
        };
        i.0.is_empty().then_some(note)
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::panic, reason = "a test")]
mod tests {
    use super::*;

    fn table() -> Arc<Table> {
        let text = "wgpu-collectives tuning 3\nkey k\n\
                    all_reduce direct 4096:1e-4~0.1 1048576:2e-3~0.05\n\
                    all_reduce device-ring 4096:3e-4 1048576:1e-3\n\
                    host-fold same-bits\nkernel-units 4\nend\n";
        Arc::new(Table::from_text(text, None).expect("a table"))
    }

    #[test]
    fn notes_round_trip() {
        let seen = vec![
            Seen {
                at: (3, 17),
                kind: Kind::AllReduce,
                bytes: 1 << 20,
                plan: Plan::DeviceRing,
                secs: 1.25e-3,
            },
            Seen {
                at: (3, 18),
                kind: Kind::Broadcast,
                bytes: 4096,
                plan: Plan::Direct,
                secs: 7e-5,
            },
        ];
        match Note::decode(&Note::Seen(seen.clone()).encode()) {
            Some(Note::Seen(back)) => assert_eq!(back, seen),
            other => panic!("{other:?}"),
        }
        let t = table();
        let explore = Arc::new(Explore {
            kind: Kind::AllReduce,
            bytes: 1 << 20,
            plans: vec![Plan::Direct, Plan::DeviceRing],
        });
        let d = Decided {
            run: 2,
            upto: 9,
            changes: vec![
                (
                    4,
                    Directive {
                        table: t.clone(),
                        explore: Some(explore.clone()),
                    },
                ),
                (
                    8,
                    Directive {
                        table: t.clone(),
                        explore: None,
                    },
                ),
            ],
        };
        let Some(Note::Decided(back)) = Note::decode(&Note::Decided(d).encode()) else {
            panic!("not a decision");
        };
        assert_eq!((back.run, back.upto, back.changes.len()), (2, 9, 2));
        assert_eq!(back.changes[0].0, 4);
        assert_eq!(back.changes[0].1.explore.as_deref(), Some(&*explore));
        assert_eq!(back.changes[1].1.explore, None);
        for (_, d) in &back.changes {
            assert_eq!(d.table.to_text("k"), t.to_text("k"));
        }
    }

    #[test]
    fn words_that_lie_about_their_lengths_are_no_note() {
        let seen = Note::Seen(vec![Seen {
            at: (1, 2),
            kind: Kind::AllReduce,
            bytes: 8,
            plan: Plan::Direct,
            secs: 1.0,
        }])
        .encode();
        // Cut short anywhere, or with a byte more: no note.
        for cut in 0..seen.len() {
            assert!(Note::decode(&seen[..cut]).is_none(), "cut at {cut}");
        }
        let mut longer = seen.clone();
        longer.push(0);
        assert!(Note::decode(&longer).is_none());
        // A count of four billion calls in a message of one.
        let mut huge = seen.clone();
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Note::decode(&huge).is_none());
        // A table's length past the end.
        let d = Note::Decided(Decided {
            run: 1,
            upto: 2,
            changes: vec![(
                0,
                Directive {
                    table: table(),
                    explore: None,
                },
            )],
        })
        .encode();
        let mut lying = d.clone();
        // tag 1, run 4, upto 8, count 4, from 8, explore 1: the length at 26.
        lying[26..30].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Note::decode(&lying).is_none());
        assert!(Note::decode(&d).is_some());
        // An unknown tag, kind or plan.
        assert!(Note::decode(&[9]).is_none());
        let mut bad_kind = seen.clone();
        bad_kind[17] = 200;
        assert!(Note::decode(&bad_kind).is_none());
    }
}
