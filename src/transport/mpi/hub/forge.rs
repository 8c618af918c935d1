//! Messages no engine sends, for the tests that check a process which
//! sends them is refused (`api/world_mpi/junk.rs`): test code, compiled
//! into test builds only.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "test code: a forgery's counts are constants"
)]

use std::time::Duration;

use super::Hub;
use crate::transport::mpi::pump::Command;
use crate::transport::mpi::routes::EARLY_FRAMES;
use crate::transport::mpi::wire::{Kind, Route, TAG_BODY, TAG_HEAD, encode_head};

impl Hub {
    /// Sends `process` what no engine sends, as `what` names it, on the
    /// world `group` of `local` ranks per process (a test's injection: see
    /// `World::forge_wire`). Returns false for a name it does not know.
    pub(crate) fn forge(&self, process: usize, group: u64, local: usize, what: &str) -> bool {
        let raw = |tag: i32, bytes: Vec<u8>| Command::Raw {
            process,
            tag,
            bytes,
        };
        // A data frame from this process's first rank to the receiver's.
        let first = |p: usize| u32::try_from(p.saturating_mul(local)).unwrap_or(u32::MAX);
        let (me, them) = (first(self.process), first(process));
        let route = |to: u32| Route {
            group,
            epoch: 0,
            to,
            from: me,
            lane: 0,
        };
        let sends: Vec<Command> = match what {
            "short-head" => vec![raw(TAG_HEAD, vec![7; 7])],
            "stray-tag" => vec![raw(TAG_HEAD.wrapping_add(40), vec![0; 16])],
            "kind" => {
                let mut h = encode_head(Kind::Data, route(them), &[], 4, 0);
                if let Some(k) = h.get_mut(17) {
                    *k = 0xee;
                }
                vec![raw(TAG_HEAD, h.to_vec()), raw(TAG_BODY, vec![0; 4])]
            }
            "long-body" => {
                let h = encode_head(Kind::Data, route(them), &[], usize::MAX >> 1, 0);
                vec![raw(TAG_HEAD, h.to_vec())]
            }
            "short-body" => {
                let h = encode_head(Kind::Data, route(them), &[], 64, 0);
                vec![raw(TAG_HEAD, h.to_vec()), raw(TAG_BODY, vec![0; 8])]
            }
            "route" => {
                // To a rank of the sender's own process.
                let h = encode_head(Kind::Data, route(me), &[], 4, 0);
                vec![raw(TAG_HEAD, h.to_vec()), raw(TAG_BODY, vec![0; 4])]
            }
            "flood" => {
                let early = Route {
                    group: group ^ 0x5eed,
                    ..route(them)
                };
                let h = encode_head(Kind::Data, early, &[], 0, 0);
                (0..=EARLY_FRAMES)
                    .flat_map(|_| [raw(TAG_HEAD, h.to_vec()), raw(TAG_BODY, Vec::new())])
                    .collect()
            }
            _ => return false,
        };
        // Paced, a few hundred frames in flight at a time, as the engine's
        // own traffic is: a flood posted at once makes MPI's progress, not
        // the receiver's checks, what the test measures.
        let mut sent = 0usize;
        sends.into_iter().all(|c| {
            sent = sent.saturating_add(1);
            if sent % 512 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            self.commands.send(c).is_ok()
        })
    }
}
