//! The list of collectives, in one place. Each entry names a kind, the
//! unit that implements it (`runtime/collectives/`) and its name in
//! errors and flight records. The list is a macro that hands itself to
//! another: `fingerprint.rs` makes `Kind` (whose wire codes are the
//! entries' order, so new collectives go last) and `collectives/mod.rs`
//! makes the typed `Collective` from the same entries.

/// Expands `$then! { Kind(module::Unit) => "name", ... }` over every collective.
macro_rules! collectives {
    ($then:ident) => {
        $then! {
            AllReduce(all_reduce::AllReduce) => "all_reduce",
            AllGather(all_gather::AllGather) => "all_gather",
            ReduceScatter(reduce_scatter::ReduceScatter) => "reduce_scatter",
            Broadcast(broadcast::Broadcast) => "broadcast",
            Reduce(reduce::Reduce) => "reduce",
            AllToAll(all_to_all::AllToAll) => "all_to_all",
            Barrier(barrier::Barrier) => "barrier",
            AllReduceCoalesced(all_reduce::AllReduceCoalesced) => "all_reduce_coalesced",
            AllGatherCoalesced(all_gather::AllGatherCoalesced) => "all_gather_coalesced",
            ReduceScatterCoalesced(reduce_scatter::ReduceScatterCoalesced) => "reduce_scatter_coalesced",
            Split(split::Split) => "split",
            Gather(gather::Gather) => "gather",
            Scatter(scatter::Scatter) => "scatter",
            Send(send_recv::Send) => "send",
            Recv(send_recv::Recv) => "recv",
            AllGatherV(all_gather_v::AllGatherV) => "all_gather_v",
            ReduceScatterV(reduce_scatter_v::ReduceScatterV) => "reduce_scatter_v",
        }
    };
}

pub(crate) use collectives;
