//! The one-shot all-reduce on host memory both devices map, for ranks on
//! separate devices that import it (see `transport/mapped.rs`).
//!
//! At small sizes what costs is the number of waits in a row, not the
//! bytes: the ring makes 2(n-1) hand-offs one after the other, and the
//! device one-shot a round trip through staging per peer. Here each rank
//! makes one device copy of its input into a slot in host memory and
//! lends it to every peer at once; each rank then folds every part from
//! the n slots where they lie into its host image, which goes up in one
//! device copy. Two fences and one round of hand-offs, whatever n.
//!
//! Each part is folded in the ring's order (from rank c+1 round to rank
//! c, with the ring's part boundaries), as the device one-shot does, so
//! the bits are the ring's whichever plan runs.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "part math within the image, whose length is the tensor's checked byte size; ranks below n <= MAX_RANKS"
)]

use crate::algo::fold::HostFold;
use crate::algo::part_words;
use crate::device::tensor::Tensor;
use crate::error::Result;
use crate::runtime::hop::{self, Packet};
use crate::runtime::prims::Prims;
use crate::transport::{Body, LoanView};

/// All-reduces `x` into `out` (n > 1 ranks) as the module says. Only where
/// this rank's slots lie in host memory its device imports
/// ([`Prims::folds_in_host_memory`]); elsewhere an error, never another
/// plan in its place.
pub(crate) fn all_reduce(p: &mut Prims, x: &Tensor, out: &Tensor, fold: HostFold) -> Result<()> {
    let (n, r) = (p.nranks, p.rank());
    let words = x.words();
    let bytes = usize::try_from(x.byte_len().next_multiple_of(4)).unwrap_or(usize::MAX);
    // Every rank's input goes as the device one-shot's does, `words`
    // words (the bytes past the view's are never written out), so that a
    // rank whose device cannot import, folding on its device, pairs with
    // this one.
    let sent = words * 4;
    let nowhere = |p: &Prims| {
        p.w.device_error(
            "the one-shot on host memory ran where this rank's device imports none (a bug)".into(),
        )
    };
    let Some(mine) = p.lend_in_host_memory((x.buffer(), x.word_offset()), bytes, sent)? else {
        return Err(nowhere(p));
    };
    for k in 1..n {
        p.post_body((r + k) % n, Body::Loan(mine.clone()))?;
    }
    // Every peer's input, as it came (no copy); rank r's own is `mine`.
    let mut came: [Option<Packet>; crate::MAX_RANKS] = std::array::from_fn(|_| None);
    for k in 1..n {
        let j = (r + k) % n;
        let mut packet = p.take_packet(j, sent)?;
        if let Body::Landed(l) = &packet.body {
            // Another process's bytes in a landing buffer: copied out.
            let mut data = p.link.buffer();
            l.read_into(&mut data)
                .map_err(|why| p.w.device_error(why))?;
            packet.body = Body::Bytes(data);
        }
        if let Some(slot) = came.get_mut(j) {
            *slot = Some(packet);
        }
    }
    let mut views: [Option<LoanView<'_>>; crate::MAX_RANKS] = std::array::from_fn(|_| None);
    for (j, view) in views.iter_mut().enumerate().take(n) {
        *view = Some(match came.get(j).and_then(Option::as_ref) {
            None => hop::read_loan(&mine, r, &p.w)?,
            Some(packet) => match &packet.body {
                Body::Loan(loan) => hop::read_loan(loan, j, &p.w)?,
                Body::Bytes(b) => LoanView::Host(b),
                Body::Mapped(m) => LoanView::Host(m.as_ref()),
                Body::Landed(_) | Body::Resident(_) => {
                    return Err(p.w.device_error(format!(
                        "rank {j} sent a one-shot's input on the device where host bytes were expected"
                    )));
                }
            },
        });
    }
    let part = part_words(words, n);
    let folded = p.fold_in_host_memory(
        None,
        (out.buffer(), out.word_offset()),
        (bytes, words * 4),
        |p, image| {
            for c in 0..n {
                let lo = (c * part * 4).min(bytes);
                let hi = ((c + 1) * part * 4).min(bytes);
                if lo == hi {
                    continue;
                }
                let input = |j: usize| -> Result<&[u8]> {
                    views
                        .get(j)
                        .and_then(Option::as_deref)
                        .and_then(|v| v.get(lo..hi))
                        .ok_or_else(|| {
                            p.w.device_error(format!(
                                "rank {j}'s one-shot input is shorter than {hi} bytes"
                            ))
                        })
                };
                let acc = image
                    .get_mut(lo..hi)
                    .ok_or_else(|| p.w.device_error("the host image is too short".into()))?;
                acc.copy_from_slice(input((c + 1) % n)?);
                for k in 2..=n {
                    fold.fold(acc, input((c + k) % n)?, k == n);
                }
            }
            Ok(())
        },
    )?;
    drop(views);
    for packet in came.into_iter().flatten() {
        hop::recycle(p.link, packet);
    }
    if folded { Ok(()) } else { Err(nowhere(p)) }
}
