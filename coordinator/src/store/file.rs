//! The two on-disk shapes the store uses: small files replaced atomically (vote, snapshot), and
//! an append-only journal of checksummed frames (the log). Both fsync before they return, so
//! whatever raft was told is durable survives a crash.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Largest frame accepted when reading back; a bigger length is a torn or corrupt tail.
const FRAME_BYTES_MAX: u32 = 64 * 1024 * 1024;

/// Writes `bytes` to `path` so that a crash leaves either the old or the new file: write a
/// temp file, fsync it, rename over, fsync the directory.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = path.with_extension("tmp");
    {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&temp, path)?;
    sync_dir(path)
}

pub fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// FNV-1a, 64 bits: enough to tell a torn frame from a whole one; this is not a defence
/// against tampering.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// An append-only file of frames: `len: u32 LE | checksum: u64 LE | payload`.
pub struct Journal {
    path: PathBuf,
    file: File,
    bytes: u64,
}

impl Journal {
    /// Opens the journal and reads every whole frame. A torn tail (a crash mid-append, before
    /// the fsync that would have acknowledged it) is cut off: it was never acknowledged.
    pub fn open(path: &Path) -> io::Result<(Journal, Vec<Vec<u8>>)> {
        let mut data = Vec::new();
        if path.exists() {
            File::open(path)?.read_to_end(&mut data)?;
        }
        let mut frames = Vec::new();
        let mut at = 0usize;
        while data.len() - at >= 12 {
            let len = u32::from_le_bytes(data[at..at + 4].try_into().map_err(io::Error::other)?);
            let sum = u64::from_le_bytes(data[at + 4..at + 12].try_into().map_err(io::Error::other)?);
            let end = at + 12 + len as usize;
            if len > FRAME_BYTES_MAX || end > data.len() || checksum(&data[at + 12..end]) != sum {
                break;
            }
            frames.push(data[at + 12..end].to_vec());
            at = end;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        if at < data.len() {
            tracing::warn!(path = %path.display(), dropped = data.len() - at, "cutting a torn journal tail");
            file.set_len(at as u64)?;
            file.sync_all()?;
        }
        Ok((Journal { path: path.to_path_buf(), file, bytes: at as u64 }, frames))
    }

    /// Appends frames and fsyncs once for all of them.
    pub fn append<'a>(&mut self, payloads: impl IntoIterator<Item = &'a [u8]>) -> io::Result<()> {
        let mut buffer = Vec::new();
        for payload in payloads {
            let len = u32::try_from(payload.len()).map_err(io::Error::other)?;
            buffer.extend_from_slice(&len.to_le_bytes());
            buffer.extend_from_slice(&checksum(payload).to_le_bytes());
            buffer.extend_from_slice(payload);
        }
        self.file.write_all(&buffer)?;
        self.file.sync_data()?;
        self.bytes += buffer.len() as u64;
        Ok(())
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Replaces the whole journal with `payloads` (compaction), atomically.
    pub fn rewrite<'a>(&mut self, payloads: impl IntoIterator<Item = &'a [u8]>) -> io::Result<()> {
        let temp = self.path.with_extension("compact");
        {
            let _ = fs::remove_file(&temp);
            let (mut fresh, _) = Journal::open(&temp)?;
            fresh.append(payloads)?;
        }
        fs::rename(&temp, &self.path)?;
        sync_dir(&self.path)?;
        let (reopened, _) = Journal::open(&self.path)?;
        *self = reopened;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_tail_is_cut_and_whole_frames_survive() {
        let dir = std::env::temp_dir().join(format!("seckill-journal-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        let _ = fs::remove_file(&path);
        let (mut journal, frames) = Journal::open(&path).unwrap();
        assert!(frames.is_empty());
        journal.append([b"one".as_slice(), b"two".as_slice()]).unwrap();
        // A crash mid-append: half a frame at the end.
        OpenOptions::new().append(true).open(&path).unwrap().write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        let (mut journal, frames) = Journal::open(&path).unwrap();
        assert_eq!(frames, vec![b"one".to_vec(), b"two".to_vec()]);
        journal.append([b"three".as_slice()]).unwrap();
        let (_, frames) = Journal::open(&path).unwrap();
        assert_eq!(frames.len(), 3, "appends after the cut are readable");
        fs::remove_dir_all(&dir).unwrap();
    }
}
