//! What a frame is on the wire between processes: its head's layout (the
//! route, the kind, the body's length, the receipt token, the sending
//! hub's generation, the runtime's packet header), the tags its two MPI
//! messages go on, and the bodies a frame may carry. Decoding trusts
//! nothing: a head of an unknown kind is refused by name (`hub.rs` checks
//! the rest against what this process knows).

use crate::transport::Mapped;

/// Bytes of a frame's head: route (group 8, to 4, from 4, lane 1, kind 1,
/// epoch 4), body length 8, receipt token 8 (0: none), the sending hub's
/// generation 8 (`GENERATION_AT`), and the packet header the runtime
/// gives (up to `HEADER`).
pub(crate) const HEAD: usize = 46 + HEADER;
/// Where in a head the sending hub's generation is: the MPI thread stamps
/// it on every head it sends.
pub(crate) const GENERATION_AT: usize = 38;
/// Most bytes of a packet header on the wire.
pub(crate) const HEADER: usize = 64;

pub(crate) const TAG_HEAD: i32 = 17;
pub(crate) const TAG_BODY: i32 = 18;

/// Most bytes of a notice's or a receipt's body: an error's text, or a
/// runtime's note (healing's carries a few tables as text).
pub(crate) const NOTE_MAX: usize = 1 << 20;

/// Where a frame goes: a rank (`to`) of a group, from a rank of it, on a lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct Route {
    pub group: u64,
    /// The run of the group the frame belongs to (see `Remote::drain`).
    pub epoch: u32,
    pub to: u32,
    pub from: u32,
    pub lane: u8,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Data = 0,
    Notice = 1,
    /// A heartbeat: the process is alive.
    Beat = 2,
    /// The process finalises MPI: silence from it from now on is no failure.
    Bye = 3,
    /// Data that a device step reads: it lands where that rank's kernels
    /// read it, when a landing buffer is free.
    Device = 4,
    /// A receiver's word on a message whose sender asked for it (the
    /// head's token): taken, refused (the body says its call), dropped.
    Receipt = 5,
}

impl Kind {
    pub(crate) fn of(code: u8) -> Option<Kind> {
        Some(match code {
            0 => Kind::Data,
            1 => Kind::Notice,
            2 => Kind::Beat,
            3 => Kind::Bye,
            4 => Kind::Device,
            5 => Kind::Receipt,
            _ => return None,
        })
    }

    /// The longest body a frame of this kind may have, given the cap on
    /// data frames.
    pub(crate) fn most(self, cap: usize) -> usize {
        match self {
            Kind::Data | Kind::Device => cap,
            Kind::Notice | Kind::Receipt => NOTE_MAX,
            Kind::Beat | Kind::Bye => 0,
        }
    }
}

/// The bytes of a frame to send: the hub's own (pooled), or a lent
/// buffer's mapping, sent in place and let go of once sent.
pub(crate) enum Outgoing {
    Bytes(Vec<u8>),
    Mapped(Mapped),
}

impl AsRef<[u8]> for Outgoing {
    fn as_ref(&self) -> &[u8] {
        match self {
            Outgoing::Bytes(b) => b,
            Outgoing::Mapped(m) => m.as_ref(),
        }
    }
}

pub(crate) fn encode_head(
    kind: Kind,
    route: Route,
    header: &[u8],
    body: usize,
    token: u64,
) -> [u8; HEAD] {
    let mut h = [0u8; HEAD];
    let mut at: usize = 0;
    let mut put = |b: &[u8]| {
        if let Some(d) = h.get_mut(at..at.saturating_add(b.len())) {
            d.copy_from_slice(b);
        }
        at = at.saturating_add(b.len());
    };
    put(&route.group.to_le_bytes());
    put(&route.to.to_le_bytes());
    put(&route.from.to_le_bytes());
    put(&[route.lane, kind as u8]);
    put(&route.epoch.to_le_bytes());
    put(&(body as u64).to_le_bytes());
    put(&token.to_le_bytes());
    // The generation: stamped by the MPI thread (`Pump::stamp`).
    put(&0u64.to_le_bytes());
    put(header.get(..HEADER.min(header.len())).unwrap_or(&[]));
    h
}

/// Writes the sending hub's `generation` into an encoded `head`.
pub(crate) fn stamp(head: &mut [u8], generation: u64) {
    let at = GENERATION_AT..GENERATION_AT.saturating_add(8);
    if let Some(g) = head.get_mut(at) {
        g.copy_from_slice(&generation.to_le_bytes());
    }
}

/// A frame's head, as `encode_head` wrote it.
pub(crate) struct Head {
    pub route: Route,
    pub kind: Kind,
    pub len: usize,
    pub token: u64,
    /// The sending hub's generation.
    pub generation: u64,
    pub header: [u8; HEADER],
}

/// `h` as a head, or why it is none.
pub(crate) fn decode_head(h: &[u8; HEAD]) -> Result<Head, String> {
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        if let Some(s) = h.get(i..i.saturating_add(8)) {
            b.copy_from_slice(s);
        }
        u64::from_le_bytes(b)
    };
    let u32_at = |i: usize| {
        let mut b = [0u8; 4];
        if let Some(s) = h.get(i..i.saturating_add(4)) {
            b.copy_from_slice(s);
        }
        u32::from_le_bytes(b)
    };
    let route = Route {
        group: u64_at(0),
        to: u32_at(8),
        from: u32_at(12),
        lane: h.get(16).copied().unwrap_or(0),
        epoch: u32_at(18),
    };
    let code = h.get(17).copied().unwrap_or(u8::MAX);
    let kind = Kind::of(code).ok_or_else(|| format!("a head of an unknown kind ({code})"))?;
    let len = usize::try_from(u64_at(22)).unwrap_or(usize::MAX);
    let token = u64_at(30);
    let generation = u64_at(GENERATION_AT);
    let mut header = [0u8; HEADER];
    if let Some(s) = h.get(GENERATION_AT.saturating_add(8)..) {
        header.copy_from_slice(s);
    }
    Ok(Head {
        route,
        kind,
        len,
        token,
        generation,
        header,
    })
}

/// A receipt's verdicts on the wire (its body's first byte).
pub(crate) const TAKEN: u8 = 0;
pub(crate) const REFUSED: u8 = 1;
pub(crate) const DROPPED: u8 = 2;

#[cfg(test)]
#[allow(
    clippy::expect_used,
    clippy::panic,
    reason = "a test: a failed expectation is a failed test"
)]
mod tests {
    use super::*;

    /// A head carries its route, kind, body length and header intact.
    #[test]
    fn a_head_decodes_to_what_was_encoded() {
        let route = Route {
            group: 0x0123_4567_89ab_cdef,
            epoch: 77,
            to: 5,
            from: 63,
            lane: 1,
        };
        let header: Vec<u8> = (0..HEADER).map(|i| (i * 3 + 1) as u8).collect();
        for kind in [
            Kind::Data,
            Kind::Notice,
            Kind::Beat,
            Kind::Bye,
            Kind::Device,
            Kind::Receipt,
        ] {
            let head = encode_head(kind, route, &header, 1 << 20, 0xfeed);
            let h = decode_head(&head).expect("a head the engine wrote");
            assert_eq!(h.route, route);
            assert!(h.kind == kind);
            assert_eq!(h.len, 1 << 20);
            assert_eq!(h.token, 0xfeed);
            assert_eq!(h.generation, 0);
            assert_eq!(h.header.as_slice(), header.as_slice());
        }
    }

    /// The generation the MPI thread stamps on a head comes back from it,
    /// and leaves the rest of the head as it was.
    #[test]
    fn wire_carries_the_generation_stamped_on_a_head() {
        let route = Route {
            group: 41,
            epoch: 2,
            to: 1,
            from: 0,
            lane: 0,
        };
        let header: Vec<u8> = (0..HEADER).map(|i| (255 - i) as u8).collect();
        for generation in [1u64, 2, 0x0102_0304_0506_0708, u64::MAX] {
            let mut head = encode_head(Kind::Data, route, &header, 4096, 9);
            stamp(&mut head, generation);
            let h = decode_head(&head).expect("a stamped head");
            assert_eq!(h.generation, generation);
            assert_eq!(h.route, route);
            assert_eq!(h.len, 4096);
            assert_eq!(h.token, 9);
            assert_eq!(h.header.as_slice(), header.as_slice());
        }
    }

    /// A head of a kind no engine sends is refused by name.
    #[test]
    fn wire_refuses_a_head_of_an_unknown_kind() {
        let mut head = encode_head(Kind::Data, Route::default(), &[], 4, 0);
        for code in [6u8, 0x7f, 0xee, 0xff] {
            head[17] = code;
            let Err(why) = decode_head(&head) else {
                panic!("kind {code} was taken");
            };
            assert!(why.contains(&format!("unknown kind ({code})")), "{why}");
        }
    }
}
