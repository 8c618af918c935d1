//! The ring's steps on a host image of the tensor (see `algo/fold.rs` for
//! when and why): the tensor comes down once, every step folds or copies
//! host memory and hands the neighbour a packet, and the result goes up
//! once. The packets are those the device steps send, so the schedule in
//! `ring.rs` is the same text for both.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "span math within the image, whose length is the working buffer's checked byte size"
)]

use crate::algo::fold::HostFold;
use crate::algo::steps::{RingSteps, Span, reduce_step};
use crate::error::Result;
use crate::runtime::prims::Prims;

/// Ring steps over `image`, a host copy of the working buffer.
pub(crate) struct HostSteps<'p, 'a> {
    pub p: &'p mut Prims<'a>,
    pub image: &'p mut [u8],
    pub fold: HostFold,
}

impl HostSteps<'_, '_> {
    /// The image's bytes of `span`, as a new packet for the next rank.
    fn post_span(&mut self, span: Span) -> Result<()> {
        let mut data = self.p.link.buffer();
        data.extend_from_slice(self.span(span)?);
        let next = self.p.next();
        self.p.post(next, data)
    }

    fn span(&self, span: Span) -> Result<&[u8]> {
        self.image
            .get(span.range())
            .ok_or_else(|| self.out_of_range(span))
    }

    fn span_mut(&mut self, span: Span) -> Result<&mut [u8]> {
        let err = self.out_of_range(span);
        self.image.get_mut(span.range()).ok_or(err)
    }

    fn out_of_range(&self, span: Span) -> crate::error::Error {
        self.p.w.device_error(format!(
            "ring step at words {}..+{} outside the {}-byte image",
            span.off,
            span.words,
            self.image.len()
        ))
    }

    /// Takes the previous rank's packet for `span`, folds it into the image
    /// (`last`: the final fold) and sends the result on in the same buffer.
    fn reduce_then(&mut self, span: Span, last: bool, forward: bool) -> Result<()> {
        self.p.step(reduce_step(last, forward), span);
        if span.words == 0 {
            return Ok(());
        }
        let prev = self.p.prev();
        let mut data = self.p.take(prev, span.bytes())?;
        let fold = self.fold;
        // Folded into the packet, which then travels on as it is: every
        // operator commutes bit for bit (IEEE addition and product, min
        // and max, wrapping integers, bitwise), so this is the image's
        // fold without copying the image back out. The image's own span
        // is needed again only once final: in the last step here, or when
        // the all-gather brings it.
        fold.fold(&mut data, self.span(span)?, last);
        if last {
            self.span_mut(span)?.copy_from_slice(&data);
        }
        self.pass_on(data, forward)
    }

    /// Sends `data` to the next rank when `forward`, else gives it back to
    /// the pool.
    fn pass_on(&mut self, data: Vec<u8>, forward: bool) -> Result<()> {
        if forward {
            let next = self.p.next();
            self.p.post(next, data)
        } else {
            self.p.recycle(data);
            Ok(())
        }
    }

    /// Takes the previous rank's final bytes for `span` into the image;
    /// forwards the same packet when `forward`.
    fn store_then(&mut self, span: Span, forward: bool) -> Result<()> {
        self.p
            .step(if forward { "recv_copy_send" } else { "recv" }, span);
        if span.words == 0 {
            return Ok(());
        }
        let prev = self.p.prev();
        let data = self.p.take(prev, span.bytes())?;
        self.span_mut(span)?.copy_from_slice(&data);
        self.pass_on(data, forward)
    }
}

impl RingSteps for HostSteps<'_, '_> {
    fn rank(&self) -> usize {
        self.p.rank()
    }
    fn nranks(&self) -> usize {
        self.p.nranks
    }
    fn step_words(&self, remaining: usize, parts: usize) -> usize {
        self.p.step_words(remaining, parts)
    }
    fn reserve(&mut self, _words: usize) -> Result<()> {
        // Packets come from the link's pool; no device staging is used.
        Ok(())
    }
    fn send(&mut self, span: Span) -> Result<()> {
        self.p.step("send", span);
        if span.words == 0 {
            return Ok(());
        }
        self.post_span(span)
    }
    fn recv_reduce_send(&mut self, span: Span) -> Result<()> {
        self.reduce_then(span, false, true)
    }
    fn recv_reduce_copy_send(&mut self, span: Span) -> Result<()> {
        self.reduce_then(span, true, true)
    }
    fn recv_copy_send(&mut self, span: Span) -> Result<()> {
        self.store_then(span, true)
    }
    fn recv(&mut self, span: Span) -> Result<()> {
        self.store_then(span, false)
    }
}
