//! all_to_all: every rank sends a (possibly different, possibly empty)
//! piece of its input to every other rank.
//!
//! Counts are agreed first: each rank tells each peer how many elements it
//! will send, and a peer expecting another count fails with both numbers,
//! so bad counts are an error on every rank instead of a hang. The pieces
//! start at arbitrary element offsets (16-bit elements at odd offsets are
//! not word aligned), so they are cut and placed in host images of the
//! input and output, which the bytes cross anyway.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "schedule index math: ranks are below n <= MAX_RANKS, and every offset and length lies within a tensor whose byte size was checked when it was made (DType::padded_bytes), or within staging sized from one"
)]

use crate::algo::steps::Steps;
use crate::error::Result;

/// Exchanges pieces: rank `r` sends `send[j]` elements (from offset
/// `sum(send[..j])`) to rank `j` and receives `recv[j]` from it.
/// `in_bytes` and `out_bytes` are the padded sizes of the input (the
/// working buffer on entry) and of `out`.
pub(crate) fn all_to_all(
    p: &mut impl Steps,
    elem: usize,
    send: &[usize],
    recv: &[usize],
    in_bytes: usize,
    out: &wgpu::Buffer,
    out_bytes: usize,
) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
    let peers = (1..n).map(|k| (r + k) % n);

    for j in peers.clone() {
        let mut d = p.empty_packet();
        d.extend_from_slice(&(send[j] as u64).to_le_bytes());
        p.post(j, d)?;
    }
    for j in peers.clone() {
        let d = p.take(j, 8)?;
        let theirs = u64::from_le_bytes(d[..8].try_into().unwrap_or([0; 8])) as usize;
        p.recycle(d);
        if theirs != recv[j] {
            let call = p.call();
            return Err(p.mismatch(
                j,
                format!("{call} expecting {} elements from rank {j}", recv[j]),
                format!("{call} sending {theirs} elements to rank {r}"),
            ));
        }
    }

    let input = if in_bytes > 0 {
        p.download_image(in_bytes)?
    } else {
        Vec::new()
    };
    let offsets = |counts: &[usize]| -> Vec<usize> {
        counts
            .iter()
            .scan(0, |acc, c| {
                let o = *acc;
                *acc += c;
                Some(o * elem)
            })
            .collect()
    };
    let (send_off, recv_off) = (offsets(send), offsets(recv));
    for j in peers.clone() {
        let mut d = p.empty_packet();
        d.extend_from_slice(&input[send_off[j]..send_off[j] + send[j] * elem]);
        p.post(j, d)?;
    }
    let mut image = vec![0u8; out_bytes];
    image[recv_off[r]..recv_off[r] + recv[r] * elem]
        .copy_from_slice(&input[send_off[r]..send_off[r] + send[r] * elem]);
    for j in peers {
        let d = p.take(j, recv[j] * elem)?;
        image[recv_off[j]..recv_off[j] + d.len()].copy_from_slice(&d);
        p.recycle(d);
    }
    if out_bytes > 0 {
        p.set_buffer(out.clone());
        p.upload_image(&image)?;
    }
    Ok(())
}
