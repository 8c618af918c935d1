//! Before a graph runs, its ranks agree on its collective sequence.
//!
//! Passes decide from what every rank shares (the traced program, the
//! cost model's agreed figures), so every rank's scheduled graph should
//! issue the same collectives. Should they not (a pass with a
//! rank-dependent decision, ranks given graphs from different pipelines),
//! the engine would catch the first mismatched collective deep in
//! execution, after earlier ones ran and with the graph's view lost. Here
//! ranks all-gather a hash of the sequence first; on a difference they
//! all-gather the sequences and every rank fails, before any of the
//! graph's collectives is issued, with the first differing collective of
//! both sides and the pass pipeline that made its own graph.

use crate::graph::ir::{Graph, Node, Op};
use crate::{Communicator, DType, Error, ReduceOp, Result};

/// Words per collective in the exchanged sequence: kind, dtype, elements
/// (two words), op or root, arguments, process group.
const WORDS: usize = 7;

/// A slot past the end of a rank's sequence.
const NONE: u32 = u32::MAX;

const KINDS: [&str; 10] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "all_to_all",
    "all_reduce_coalesced",
    "reduce",
    "all_reduce_",
    "all_gather_coalesced",
    "reduce_scatter_coalesced",
];

/// Roots are packed above the operator in the attribute word.
const OPS: u32 = 16;

fn index<T: PartialEq>(all: &[T], x: &T) -> u32 {
    all.iter()
        .position(|a| a == x)
        .and_then(|i| u32::try_from(i).ok())
        .unwrap_or(NONE - 1)
}

/// A collective node as words every rank can compare and print.
fn describe(n: &Node) -> [u32; WORDS] {
    let attr = match n.op {
        Op::AllReduce(op)
        | Op::ReduceScatter(op)
        | Op::AllReduceCoalesced(op)
        | Op::ReduceScatterCoalesced(op)
        | Op::AllReduceInPlace(op) => index(&ReduceOp::ALL, &op),
        Op::Broadcast(root) => u32::try_from(root).unwrap_or(NONE - 1),
        Op::Reduce(op, root) => u32::try_from(root)
            .ok()
            .and_then(|r| r.checked_mul(OPS))
            .map_or(NONE - 1, |r| r.saturating_add(index(&ReduceOp::ALL, &op))),
        _ => 0,
    };
    // An uneven all_to_all's lengths differ between ranks (the engine
    // checks its counts pair by pair).
    let len = match n.op {
        Op::AllToAllV { .. } => 0,
        _ => n.len() as u64,
    };
    [
        index(&KINDS, &n.op.name()),
        index(&DType::ALL, &n.dtype),
        len as u32,
        (len >> 32) as u32,
        attr,
        u32::try_from(n.args.len()).unwrap_or(NONE - 1),
        u32::try_from(n.group).unwrap_or(NONE - 1),
    ]
}

/// The words of [`describe`], in words.
fn text(d: &[u32]) -> String {
    if d.first() == Some(&NONE) {
        return "nothing (its graph has no more collectives)".into();
    }
    let at = |i: usize| d.get(i).copied().unwrap_or(NONE - 1) as usize;
    let kind = KINDS.get(at(0)).copied().unwrap_or("an unknown collective");
    let dtype = DType::ALL
        .get(at(1))
        .map_or("an unknown dtype".to_string(), |t| t.to_string());
    let len = (at(3) as u64) << 32 | at(2) as u64;
    let op = |i: usize| {
        ReduceOp::ALL
            .get(i)
            .map_or(String::new(), |op| format!(", {}", op.name()))
    };
    let ops = OPS as usize;
    let attr = match kind {
        "broadcast" => format!(", root {}", at(4)),
        "reduce" => format!(
            "{}, root {}",
            op(at(4).checked_rem(ops).unwrap_or(0)),
            at(4).checked_div(ops).unwrap_or(0)
        ),
        "all_gather" | "all_gather_coalesced" | "all_to_all" => String::new(),
        _ => op(at(4)),
    };
    let group = match at(6) {
        0 => String::new(),
        g => format!(", group {g}"),
    };
    format!(
        "{kind}({dtype}, {len} elements{attr}, {} tensors{group})",
        at(5)
    )
}

/// FNV-1a over the sequence and its length.
fn hash(seq: &[[u32; WORDS]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let words = std::iter::once(seq.len() as u32).chain(seq.iter().flatten().copied());
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Checks with the other ranks of `comm` that `g` issues the same
/// collectives as theirs; `Error::Mismatch` on every rank if not.
pub(crate) fn agree(g: &Graph, comm: &Communicator) -> Result<()> {
    let n = comm.size();
    if n < 2 {
        return Ok(());
    }
    let mine: Vec<[u32; WORDS]> = g.collectives().map(describe).collect();
    let h = hash(&mine);
    let count = u32::try_from(mine.len()).unwrap_or(NONE);
    let head = [count, h as u32, (h >> 32) as u32];
    let heads = comm
        .all_gather(&comm.tensor(&head)?)?
        .wait()?
        .to_vec::<u32>()?;
    if heads.chunks(3).all(|c| c == head) {
        return Ok(());
    }
    // Every rank saw the same heads, so every rank is here: compare in full.
    let longest = heads.chunks(3).map(|c| c[0] as usize).max().unwrap_or(0);
    let mut padded = vec![NONE; longest.saturating_mul(WORDS)];
    for (slot, d) in padded.chunks_mut(WORDS).zip(&mine) {
        slot.copy_from_slice(d);
    }
    let all = comm
        .all_gather(&comm.tensor(&padded)?)?
        .wait()?
        .to_vec::<u32>()?;
    // Rank j's sequence, one collective per chunk.
    let seqs: Vec<Vec<&[u32]>> = all
        .chunks(padded.len().max(1))
        .map(|s| s.chunks(WORDS).collect())
        .collect();
    let rank = comm.rank();
    for (i, ours) in padded.chunks(WORDS).enumerate() {
        let differs = seqs
            .iter()
            .enumerate()
            .find(|(_, s)| s.get(i).copied() != Some(ours));
        if let Some((peer, s)) = differs {
            let theirs = s.get(i).copied().unwrap_or(&[]);
            return Err(Error::Mismatch {
                rank,
                seq: i as u64,
                ours: format!(
                    "collective {i} of this rank's graph (passes {}): {}",
                    g.pipeline(),
                    text(ours)
                ),
                peer,
                theirs: format!("rank {peer}'s collective {i}: {}", text(theirs)),
                flight: String::new(),
            });
        }
    }
    // Equal sequences whose heads differed: only a length past u32 gets here.
    Ok(())
}
