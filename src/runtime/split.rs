//! Groups that `split` is forming, until every member has joined: the
//! first member of a color to arrive makes the new group's links (which
//! carry its meeting place, when the parent's did) and its health record
//! (a child of the parent's).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::device::lock;
use crate::error::{Error, Result};
use crate::runtime::health::Health;
use crate::runtime::hop::Link;

/// One group's splits in progress.
#[derive(Default)]
pub(crate) struct Splits {
    forming: Mutex<HashMap<(u64, u32), Forming>>,
}

/// A group one `split` is forming: its links, and its shared record.
struct Forming {
    endpoints: Vec<Option<Arc<Link>>>,
    joined: Joined,
}

/// What a member of a new group gets besides its own link.
#[derive(Clone)]
pub(crate) struct Joined {
    pub health: Arc<Health>,
    /// The new group's own splits.
    pub splits: Arc<Splits>,
}

impl Splits {
    /// Joins the group that `split` number `seq` forms for `color` out of
    /// `parents` (ranks of the group `health` records, in the new group's
    /// order), as its rank `me`.
    pub(crate) fn join(
        &self,
        health: &Arc<Health>,
        link: &Link,
        (seq, color): (u64, u32),
        parents: &[usize],
        me: usize,
    ) -> Result<(Arc<Link>, Joined)> {
        let mut forming = lock(&self.forming);
        let f = forming.entry((seq, color)).or_insert_with(|| Forming {
            endpoints: link.split(seq, color, parents),
            joined: Joined {
                health: Arc::new(Health::with_parent(
                    parents.len(),
                    (health.clone(), parents.to_vec()),
                )),
                splits: Arc::new(Splits::default()),
            },
        });
        let endpoint = f
            .endpoints
            .get_mut(me)
            .and_then(Option::take)
            .ok_or_else(|| Error::InvalidArgument {
                rank: Some(parents.get(me).copied().unwrap_or(me)),
                what: format!("split #{seq}: rank {me} of color {color} joined twice"),
            })?;
        let joined = f.joined.clone();
        if f.endpoints.iter().all(Option::is_none) {
            forming.remove(&(seq, color));
        }
        Ok((endpoint, joined))
    }

    /// Forgets splits left half-formed (a new run starts).
    pub(crate) fn clear(&self) {
        lock(&self.forming).clear();
    }
}
