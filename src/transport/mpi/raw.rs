//! The raw MPI calls the `mpi` crate does not offer safely: a send that
//! owns its buffer until MPI is done with it (the crate's non-blocking
//! sends borrow theirs for a scope, which a pump that keeps many sends in
//! flight across its loop cannot give), and `MPI_ERRORS_RETURN`, so that a
//! failed call is an error the engine reports instead of MPI's default of
//! ending the job.
#![allow(unsafe_code)]

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

use super::hub::Outgoing;

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

/// Receives the next message from `source` with `tag` on `comm` into the
/// `len` bytes at `ptr` (blocking): a mapping that safe code can only
/// write through.
pub(crate) fn receive_raw(
    comm: &SimpleCommunicator,
    source: i32,
    tag: i32,
    ptr: std::ptr::NonNull<u8>,
    len: usize,
) -> Result<(), Code> {
    let count = i32::try_from(len).map_err(|_| Code(-1))?;
    // SAFETY: `ptr` points to `len` writable bytes that stay mapped until
    // this returns (the caller holds their view); the count is `len`
    // MPI_BYTEs, `comm` is a live communicator, and the status is ignored.
    check(unsafe {
        ffi::MPI_Recv(
            ptr.as_ptr().cast(),
            count,
            ffi::RSMPI_UINT8_T,
            source,
            tag,
            comm.as_raw(),
            ffi::RSMPI_STATUS_IGNORE,
        )
    })
}
