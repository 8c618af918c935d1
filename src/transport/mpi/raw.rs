//! The raw MPI calls the `mpi` crate does not offer safely: a send that
//! owns its buffer until MPI is done with it (the crate's non-blocking
//! sends borrow theirs for a scope, which a pump that keeps many sends in
//! flight across its loop cannot give), `MPI_ERRORS_RETURN`, so that a
//! failed call is an error the engine reports instead of MPI's default of
//! ending the job, a matched receive that reports a message longer than
//! its buffer instead of panicking (the wire is not trusted), and the
//! duplicate of an application's communicator.
#![allow(unsafe_code)]

use mpi::ffi;
use mpi::point_to_point::Message;
use mpi::raw::{AsRaw, AsRawMut};
use mpi::topology::SimpleCommunicator;

use super::wire::Outgoing;

/// A non-blocking send in flight, holding its bytes until it completes.
pub(crate) struct Sending {
    request: ffi::MPI_Request,
    /// The bytes MPI reads until `test` says it is done: moving a `Vec`
    /// does not move its heap buffer, nor moving a view its mapping, and
    /// nothing writes to either meanwhile.
    bytes: Option<Outgoing>,
}

/// Why an MPI call failed: its error code.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Code(pub i32);

fn check(code: i32) -> Result<(), Code> {
    // MPI_SUCCESS is 0 in every implementation (the standard fixes it).
    if code == 0 { Ok(()) } else { Err(Code(code)) }
}

/// Starts sending `bytes` to rank `to` of `comm` with `tag`; on failure
/// the bytes come back (unboxed: boxing would allocate per frame).
#[allow(clippy::result_large_err)]
pub(crate) fn isend(
    comm: &SimpleCommunicator,
    to: i32,
    tag: i32,
    bytes: Outgoing,
) -> Result<Sending, (Code, Outgoing)> {
    let Ok(count) = i32::try_from(bytes.as_ref().len()) else {
        // MPI counts are C ints; the engine's slices are at most 1 MiB.
        return Err((Code(-1), bytes));
    };
    let mut request = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
    // SAFETY: `bytes` outlives the request: it moves into the returned
    // `Sending` and is only dropped once `test` reports completion (or the
    // process ends with MPI); a mapping stays mapped while its view lives. The datatype is MPI_BYTE (RSMPI_UINT8_T) with
    // `count` = its length, `comm` is a live communicator, and `request` is
    // written by MPI_Isend before it is read.
    let code = unsafe {
        ffi::MPI_Isend(
            bytes.as_ref().as_ptr().cast(),
            count,
            ffi::RSMPI_UINT8_T,
            to,
            tag,
            comm.as_raw(),
            request.as_mut_ptr(),
        )
    };
    match check(code) {
        // SAFETY: MPI_Isend succeeded, so it wrote the request.
        Ok(()) => Ok(Sending {
            request: unsafe { request.assume_init() },
            bytes: Some(bytes),
        }),
        Err(c) => Err((c, bytes)),
    }
}

impl Sending {
    /// Whether the send is done; then its bytes are free again.
    pub(crate) fn test(&mut self) -> Result<Option<Outgoing>, Code> {
        let mut flag: i32 = 0;
        // SAFETY: `self.request` came from MPI_Isend and has not completed
        // yet (a completed `Sending` is consumed below, never tested again);
        // MPI_Test sets it to MPI_REQUEST_NULL when it completes. The status
        // is ignored (RSMPI_STATUS_IGNORE).
        let code = unsafe { ffi::MPI_Test(&mut self.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        check(code)?;
        Ok(if flag != 0 { self.bytes.take() } else { None })
    }
}

/// Makes failed calls on `comm` return their error code instead of ending
/// the job (MPI's default handler is `MPI_ERRORS_ARE_FATAL`).
pub(crate) fn errors_return(comm: &SimpleCommunicator) -> Result<(), Code> {
    // SAFETY: `comm` is a live communicator and RSMPI_ERRORS_RETURN is the
    // predefined handler; the call only changes how errors are reported.
    check(unsafe { ffi::MPI_Comm_set_errhandler(comm.as_raw(), ffi::RSMPI_ERRORS_RETURN) })
}

/// A duplicate of a communicator, on its way to the MPI thread that owns
/// it from then on.
pub(crate) struct Duplicate(ffi::MPI_Comm);

// SAFETY: an MPI communicator handle is an opaque value that names a
// communicator of this process; under MPI_THREAD_MULTIPLE (checked before a
// duplicate is made) any thread may use it, and the duplicate is used by
// one thread only: the MPI thread it is sent to.
unsafe impl Send for Duplicate {}

/// A duplicate of `comm` (`MPI_Comm_dup`: collective over its processes),
/// so that no message of the engine matches one of the application's.
pub(crate) fn duplicate(comm: &impl AsRaw<Raw = ffi::MPI_Comm>) -> Result<Duplicate, Code> {
    let mut dup = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
    // SAFETY: `comm` is a live communicator (the caller's, borrowed for the
    // call), and MPI_Comm_dup writes the new handle before it is read.
    check(unsafe { ffi::MPI_Comm_dup(comm.as_raw(), dup.as_mut_ptr()) })?;
    // SAFETY: MPI_Comm_dup succeeded, so it wrote the handle.
    Ok(Duplicate(unsafe { dup.assume_init() }))
}

impl Duplicate {
    /// The communicator, owned: freed (`MPI_Comm_free`) when dropped.
    pub(crate) fn adopt(self) -> SimpleCommunicator {
        use mpi::raw::FromRaw;
        // SAFETY: the handle is a live intra-communicator that MPI_Comm_dup
        // made and nothing else holds (this consumes the only `Duplicate`);
        // it is neither MPI_COMM_WORLD nor MPI_COMM_SELF.
        unsafe { SimpleCommunicator::from_raw(self.0) }
    }
}

/// Receives the probed `message` into the `len` bytes at `ptr`. A message
/// longer than `len` is consumed all the same and is an error (MPI's
/// `MPI_ERR_TRUNCATE`), never a write past the buffer.
pub(crate) fn matched_receive(
    mut message: Message,
    ptr: std::ptr::NonNull<u8>,
    len: usize,
) -> Result<(), Code> {
    let count = i32::try_from(len).map_err(|_| Code(-1))?;
    // SAFETY: `ptr` points to `len` writable bytes that stay valid until
    // this returns (the caller's buffer, or a mapping whose view it
    // holds); MPI writes at most `count` MPI_BYTEs there. The message came
    // from a matched probe on a communicator with MPI_ERRORS_RETURN, so a
    // longer message returns an error code instead of ending the job, and
    // the status is ignored.
    let code = unsafe {
        ffi::MPI_Mrecv(
            ptr.as_ptr().cast(),
            count,
            ffi::RSMPI_UINT8_T,
            message.as_raw_mut(),
            ffi::RSMPI_STATUS_IGNORE,
        )
    };
    // The handle names nothing of ours any more (MPI_Mrecv consumed the
    // message, or failed on it): the crate's drop would assert that it is
    // MPI_MESSAGE_NULL, which a failed receive need not leave.
    std::mem::forget(message);
    check(code)
}

/// Consumes the probed `message` without keeping any of it: the bytes of
/// a process whose frames are refused. Nothing is allocated for it.
pub(crate) fn discard(message: Message) {
    let mut none = [0u8; 1];
    // A longer message fails with MPI_ERR_TRUNCATE, consumed: the point.
    let _ = matched_receive(message, std::ptr::NonNull::from(&mut none).cast(), 0);
}
