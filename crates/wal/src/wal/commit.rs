//! Forcing, group commit and the log's I/O: one batch at a time, prepared under the state
//! lock and run without it.

use super::*;

impl Wal {
    // ----- forcing and group commit ------------------------------------------------------

    /// Returns once every record whose LSN is at most `lsn` is durable.
    ///
    /// Group commit (001 §3.2, after Hagmann's Cedar): the first forcer to find no I/O under
    /// way becomes the group's *leader*. It waits up to the group wait (see [`GroupWait`])
    /// while fewer forcers have joined than the last flush served — a single forcing thread
    /// never waits — then writes everything appended so far and flushes once; every forcer
    /// whose record that covered returns. Forcers that arrive during the flush form the next
    /// group.
    pub fn force(&self, lsn: Lsn) -> Result<(), WalError> {
        self.forces.fetch_add(1, Ordering::Relaxed);
        if self.durable.load(Ordering::Acquire) > lsn.0 {
            self.forces_fast.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let mut st = self.st.lock();
        if lsn.0 >= st.end {
            return Err(WalError::NotAppended(lsn));
        }
        let mut waited = false;
        loop {
            if st.durable > lsn.0 {
                if !waited {
                    self.forces_fast.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(());
            }
            if let Some(f) = &st.failed {
                return Err(WalError::Failed(f.clone()));
            }
            if !st.io_busy {
                return self.lead(&mut st);
            }
            st.waiters.push(lsn.0);
            if st.leader_waiting {
                self.leader_cv.notify_one();
            }
            self.io_cv.wait(&mut st);
            if let Some(i) = st.waiters.iter().position(|&w| w == lsn.0) {
                st.waiters.swap_remove(i);
            }
            waited = true;
        }
    }

    /// Makes every record appended so far durable (a force of the last one).
    pub fn sync(&self) -> Result<(), WalError> {
        let end = self.st.lock().end;
        if self.durable.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        self.force(Lsn(end - 1))
    }

    /// The leader's part of a force: wait for the group, write, flush.
    fn lead(&self, st: &mut MutexGuard<'_, State>) -> Result<(), WalError> {
        st.io_busy = true;
        self.gather(st);
        let to = st.end;
        let flush = !plant::on(Plant::ForceWithoutFlush);
        let job = self.job(st, to, flush, true, None);
        let r = MutexGuard::unlocked(st, || self.run(&job));
        // The group: the leader and every waiter this flush made durable, including those
        // that joined while it ran (their records were appended before it started).
        let group = 1 + self.finish(st, &job, r)?;
        let c = &mut st.c;
        c.groups += 1;
        c.group_members += group;
        c.group_max = c.group_max.max(group);
        c.group_sizes[WalStats::bucket(group)] += 1;
        st.last_group = group as usize;
        Ok(())
    }

    /// The leader waits for its group: while fewer forcers have joined than the last flush
    /// served, up to the group wait. jbd2 batches synchronous commits the same way (it sleeps
    /// while new handles keep joining, up to its average commit time).
    fn gather(&self, st: &mut MutexGuard<'_, State>) {
        let wait = self.group_wait_of(st);
        let joined = |st: &State| 1 + st.waiters.iter().filter(|&&w| w >= st.durable).count();
        if wait.is_zero() || joined(st) >= st.last_group {
            return;
        }
        let start = Instant::now();
        let deadline = start + wait;
        st.leader_waiting = true;
        while joined(st) < st.last_group {
            if self.leader_cv.wait_until(st, deadline).timed_out() {
                break;
            }
        }
        st.leader_waiting = false;
        st.c.leader_waits += 1;
        st.c.leader_wait_ns += start.elapsed().as_nanos() as u64;
    }

    // ----- I/O ---------------------------------------------------------------------------

    /// Prepares the write of everything from the block holding `written` up to `to` (zero
    /// padded to a block), and optionally a superblock and a flush.
    pub(super) fn job(
        &self,
        st: &State,
        to: u64,
        flush: bool,
        makes_durable: bool,
        sb: Option<Superblock>,
    ) -> Job {
        let from = st.buf_start;
        let data = if to > st.written {
            let mut d = st.buf[..(to - from) as usize].to_vec();
            d.resize((self.geo.up(to) - from) as usize, 0);
            d
        } else {
            Vec::new()
        };
        Job {
            from,
            data,
            to: to.max(st.written),
            flush,
            makes_durable,
            sb,
        }
    }

    pub(super) fn run(&self, job: &Job) -> std::io::Result<Done> {
        let mut done = Done {
            writes: 0,
            bytes: 0,
            flush_time: None,
        };
        if !job.data.is_empty() {
            done.writes += self.geo.write(&*self.dev, job.from, &job.data)?;
            done.bytes += job.data.len() as u64;
        }
        if let Some(sb) = &job.sb {
            write_superblock(&*self.dev, &self.geo, sb)?;
            done.writes += 1;
            done.bytes += self.geo.bs;
        }
        if job.flush {
            let t = Instant::now();
            self.dev.flush()?;
            done.flush_time = Some(t.elapsed());
        }
        Ok(done)
    }

    /// Records a finished batch: what is written and durable now, the buffer trimmed to the
    /// tail block, the superblock's new state; or the failure that poisons the log. Returns
    /// how many waiting forcers the batch made durable.
    pub(super) fn finish(
        &self,
        st: &mut MutexGuard<'_, State>,
        job: &Job,
        r: std::io::Result<Done>,
    ) -> Result<u64, WalError> {
        st.io_busy = false;
        self.io_cv.notify_all();
        let done = match r {
            Ok(d) => d,
            Err(e) => {
                st.failed = Some(e.to_string());
                return Err(WalError::Io(e));
            }
        };
        st.c.writes += done.writes;
        st.c.bytes_written += done.bytes;
        if let Some(t) = done.flush_time {
            st.c.flushes += 1;
            // A moving average (jbd2 weighs its average commit time the same way).
            st.flush_avg = if st.flush_avg.is_zero() {
                t
            } else {
                (st.flush_avg * 3 + t) / 4
            };
        }
        st.written = st.written.max(job.to);
        let keep = self.geo.down(st.written);
        if keep > st.buf_start {
            let n = (keep - st.buf_start) as usize;
            st.buf.drain(..n);
            st.buf_start = keep;
        }
        let mut served = 0;
        if job.makes_durable && job.to > st.durable {
            let old = st.durable;
            served = st
                .waiters
                .iter()
                .filter(|&&w| w >= old && w < job.to)
                .count() as u64;
            st.durable = job.to;
            self.durable.store(job.to, Ordering::Release);
        }
        if let Some(sb) = &job.sb {
            st.sb_seq = sb.sequence;
            st.owner = sb.owner;
            if sb.checkpoint != st.checkpoint {
                st.c.checkpoints += 1;
            }
            st.checkpoint = sb.checkpoint;
            if !st.low_armed && self.free_of(st) >= self.low_water() {
                st.low_armed = true;
            }
        }
        Ok(served)
    }

    /// Waits for the I/O slot and takes it.
    pub(super) fn take_io(&self, st: &mut MutexGuard<'_, State>) -> Result<(), WalError> {
        loop {
            if let Some(f) = &st.failed {
                return Err(WalError::Failed(f.clone()));
            }
            if !st.io_busy {
                st.io_busy = true;
                return Ok(());
            }
            self.io_cv.wait(st);
        }
    }

    /// Writes the whole blocks waiting in memory when there are enough of them and nobody else
    /// is doing I/O (asynchronous logging writes its buffer when it is full). A failure
    /// poisons the log; the append that triggered it has still happened, and the next force
    /// reports the failure.
    pub(super) fn maybe_write_behind(&self, st: &mut MutexGuard<'_, State>) {
        let wb = self.write_behind();
        if wb == 0 || st.io_busy || st.failed.is_some() {
            return;
        }
        let to = self.geo.down(st.end);
        if to <= st.written || to - st.written < wb {
            return;
        }
        st.io_busy = true;
        let job = self.job(st, to, false, false, None);
        let r = MutexGuard::unlocked(st, || self.run(&job));
        if self.finish(st, &job, r).is_ok() {
            st.c.write_behinds += 1;
        }
    }
}
