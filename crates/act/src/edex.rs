//! `-edex`: tells an AWIPS EDEX ingest about each file a FILE entry wrote, as pqact does when
//! started with `-e` (ldm-formats.md §2): a System V shared-memory ring of 5000 slots
//! `{ char filename[4096]; char ident[256]; }` (key `ftok("/etc/rc.d/rc.local", 'R')`) and a
//! set of two semaphores (key `ftok(…, 'e')`); after a file is written its slot is filled and
//! semaphore 1 is set to the slot's index, then the index moves on (back to 0 after 4999). The
//! segment and the semaphores are removed at exit, as pqact removes them.

use std::ffi::CString;

/// Slots in the ring.
pub const SLOTS: usize = 5000;
const FILENAME_LEN: usize = 4096;
const IDENT_LEN: usize = 256;
const SLOT_LEN: usize = FILENAME_LEN + IDENT_LEN;
/// The file whose identity keys the segment (as the EDEX ingest expects).
pub const KEY_FILE: &str = "/etc/rc.d/rc.local";

/// The notification ring.
#[derive(Debug)]
pub struct Edex {
    shm_id: libc::c_int,
    sem_id: libc::c_int,
    next: usize,
}

/// The ring cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("EDEX notification is not available ({what}: {source}); -edex entries will only write their files")]
pub struct EdexError {
    what: &'static str,
    source: std::io::Error,
}

fn key(id: u8) -> Result<libc::key_t, EdexError> {
    let path = CString::new(KEY_FILE).expect("no NUL");
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    #[allow(unsafe_code)]
    let key = unsafe { libc::ftok(path.as_ptr(), libc::c_int::from(id)) };
    if key == -1 {
        return Err(EdexError { what: "ftok(\"/etc/rc.d/rc.local\")", source: std::io::Error::last_os_error() });
    }
    Ok(key)
}

impl Edex {
    /// Creates (or attaches to) the segment and the semaphores.
    pub fn open() -> Result<Self, EdexError> {
        let (shm_key, sem_key) = (key(b'R')?, key(b'e')?);
        // SAFETY: plain system calls on integer arguments; the results are checked.
        #[allow(unsafe_code)]
        let shm_id = unsafe { libc::shmget(shm_key, SLOT_LEN * SLOTS, 0o666 | libc::IPC_CREAT) };
        if shm_id == -1 {
            return Err(EdexError { what: "shmget", source: std::io::Error::last_os_error() });
        }
        // SAFETY: as above.
        #[allow(unsafe_code)]
        let sem_id = unsafe { libc::semget(sem_key, 2, 0o666 | libc::IPC_CREAT) };
        if sem_id == -1 {
            return Err(EdexError { what: "semget", source: std::io::Error::last_os_error() });
        }
        Ok(Self { shm_id, sem_id, next: 0 })
    }

    /// Announces a written file.
    pub fn announce(&mut self, filename: &str, ident: &str) -> std::io::Result<()> {
        // SAFETY: attaching a segment we created with `SLOT_LEN * SLOTS` bytes; the result is
        // checked before use.
        #[allow(unsafe_code)]
        let base = unsafe { libc::shmat(self.shm_id, std::ptr::null(), 0) };
        if base as isize == -1 {
            return Err(std::io::Error::last_os_error());
        }
        let mut slot = [0u8; SLOT_LEN];
        copy_c_string(&mut slot[..FILENAME_LEN], filename.as_bytes());
        copy_c_string(&mut slot[FILENAME_LEN..], ident.as_bytes());
        // SAFETY: `base` maps `SLOT_LEN * SLOTS` bytes and `next < SLOTS`, so the slot lies
        // inside it; `slot` is a separate local buffer; the segment is detached right after.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(slot.as_ptr(), base.cast::<u8>().add(self.next * SLOT_LEN), SLOT_LEN);
            libc::shmdt(base);
        }
        // SETVAL reads `union semun`'s `int val`; an int argument is passed in its place, as
        // C callers do.
        // SAFETY: `sem_id` is a set of two semaphores; index 1 exists.
        #[allow(unsafe_code)]
        let status = unsafe { libc::semctl(self.sem_id, 1, libc::SETVAL, self.next as libc::c_int) };
        self.next = if self.next == SLOTS - 1 { 0 } else { self.next + 1 };
        if status == -1 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
    }
}

/// What slot `index` of an existing ring holds (file name, identifier), and semaphore 1's value:
/// what an EDEX ingest reads (for tests and diagnosis).
pub fn read_slot(index: usize) -> std::io::Result<(String, String, i32)> {
    if index >= SLOTS {
        return Err(std::io::Error::other("no such slot"));
    }
    let (shm_key, sem_key) = (key(b'R').map_err(|error| error.source)?, key(b'e').map_err(|error| error.source)?);
    // SAFETY: plain system calls on integer arguments; the results are checked.
    #[allow(unsafe_code)]
    let (shm_id, sem_id) = unsafe { (libc::shmget(shm_key, 0, 0), libc::semget(sem_key, 0, 0)) };
    if shm_id == -1 || sem_id == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: attaching an existing segment read-only; checked before use.
    #[allow(unsafe_code)]
    let base = unsafe { libc::shmat(shm_id, std::ptr::null(), libc::SHM_RDONLY) };
    if base as isize == -1 {
        return Err(std::io::Error::last_os_error());
    }
    let mut slot = [0u8; SLOT_LEN];
    // SAFETY: the ring is `SLOT_LEN * SLOTS` bytes and `index < SLOTS`; detached right after.
    #[allow(unsafe_code)]
    unsafe {
        std::ptr::copy_nonoverlapping(base.cast::<u8>().add(index * SLOT_LEN), slot.as_mut_ptr(), SLOT_LEN);
        libc::shmdt(base);
    }
    // SAFETY: GETVAL on semaphore 1 of a set of two.
    #[allow(unsafe_code)]
    let value = unsafe { libc::semctl(sem_id, 1, libc::GETVAL) };
    let field = |bytes: &[u8]| {
        let end = bytes.iter().position(|&byte| byte == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    Ok((field(&slot[..FILENAME_LEN]), field(&slot[FILENAME_LEN..]), value))
}

/// `strncpy` into a fixed field, always NUL-terminated.
fn copy_c_string(field: &mut [u8], text: &[u8]) {
    let len = text.len().min(field.len() - 1);
    field[..len].copy_from_slice(&text[..len]);
}

impl Drop for Edex {
    fn drop(&mut self) {
        // SAFETY: removing the segment and the semaphore set this process created or attached.
        #[allow(unsafe_code)]
        unsafe {
            libc::shmctl(self.shm_id, libc::IPC_RMID, std::ptr::null_mut());
            libc::semctl(self.sem_id, 0, libc::IPC_RMID);
        }
    }
}
