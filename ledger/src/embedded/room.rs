//! The waiting room in process: `room.lua`'s rules on the embedded ledger's books, step for step
//! (the suite runs both).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::Book;
use crate::room::{drawn_order, ROOM_ADMITS_PER_CALL_MAX, ROOM_BUCKET_SECONDS};
use crate::*;

pub(super) use crate::room::ROOM_TICK_USERS_MAX as TICK_USERS_MAX;

/// `room.lua`'s keys, as fields.
#[derive(Default)]
pub(super) struct Room {
    /// The last position handed out.
    next: u64,
    admitted: u64,
    /// The admission bucket: its level and when it was last filled (ms).
    bucket: Option<(f64, u64)>,
    draw: Option<Draw>,
    pre: BTreeSet<UserId>,
    /// Position → user, and back.
    line: BTreeMap<u64, UserId>,
    positions: HashMap<UserId, u64>,
    seen: HashMap<UserId, u64>,
    /// Admitted user → its ticket's expiry (ms), until spent or expired.
    live: HashMap<UserId, u64>,
    tickets: HashMap<UserId, (SubmitToken, u64)>,
    log: Vec<Admission>,
}

impl Room {
    pub(super) fn ticket_spent(&mut self, user: &UserId) {
        self.live.remove(user);
    }

    pub(super) fn admissions(&self, after: u64, limit: usize) -> Vec<Admission> {
        let start = usize::try_from(after).unwrap_or(usize::MAX).min(self.log.len());
        self.log[start..].iter().take(limit.max(1)).cloned().collect()
    }

    fn enqueue(&mut self, user: &UserId) {
        self.next += 1;
        self.line.insert(self.next, user.clone());
        self.positions.insert(user.clone(), self.next);
    }

    fn leave(&mut self, user: &UserId) {
        if let Some(position) = self.positions.remove(user) {
            self.line.remove(&position);
        }
        self.pre.remove(user);
        self.seen.remove(user);
    }

    fn draw(&mut self, seed: &str, now_ms: u64) {
        let order: Vec<UserId> = drawn_order(seed, self.pre.iter().map(UserId::as_str))
            .into_iter()
            .filter_map(|u| UserId::new(u).ok())
            .collect();
        for user in &order {
            self.enqueue(user);
        }
        self.pre.clear();
        self.draw = Some(Draw { seed: seed.to_owned(), at_ms: now_ms, placed: order.len() as u64 });
    }

    fn sweep(&mut self, abandon_ms: u64, now_ms: u64) {
        let gone: Vec<UserId> =
            self.seen.iter().filter(|(_, seen)| **seen + abandon_ms < now_ms).map(|(user, _)| user.clone()).collect();
        for user in gone {
            self.leave(&user);
        }
    }
}

impl Book {
    /// The room as it stands, if it ever ran (`room.lua`'s keys exist once a call was made).
    pub(super) fn room_figures(&self, now_ms: u64) -> Option<RoomFigures> {
        let room = &self.room;
        let ran = room.draw.is_some() || room.bucket.is_some() || !room.pre.is_empty() || room.next > 0;
        ran.then(|| self.figures_at(now_ms))
    }

    fn figures_at(&self, now_ms: u64) -> RoomFigures {
        let room = &self.room;
        RoomFigures {
            now_ms,
            remaining: self.remaining,
            closed: self.closed,
            draw: room.draw.clone(),
            waiting: if room.draw.is_some() { room.line.len() } else { room.pre.len() } as u64,
            admitted: room.admitted,
            live: room.live.values().filter(|expires| **expires > now_ms).count() as u64,
            head: room.line.keys().next().copied(),
        }
    }

    /// The joins of `users` (`joining`) or a tick naming them: `room.lua` in process.
    pub(super) fn room_call(
        &mut self,
        call: RoomCall<'_>,
        joining: bool,
        users: &[UserId],
    ) -> Result<RoomView, LedgerError> {
        let now_ms = crate::unix_ms();
        let now = Instant::now();
        if call.starts_at_ms.is_none_or(|start| now_ms >= start) && self.room.draw.is_none() {
            self.room.draw(call.seed, now_ms);
        }
        for user in if joining { users } else { &[] } {
            if self.room_place(user, now_ms, now) == Place::Absent && !self.closed && self.remaining > 0 {
                if self.room.draw.is_some() {
                    self.room.enqueue(user);
                } else {
                    self.room.pre.insert(user.clone());
                }
                self.room.seen.insert(user.clone(), now_ms);
            }
        }
        for user in users {
            if let Some(seen) = self.room.seen.get_mut(user) {
                *seen = now_ms;
            }
        }
        self.room.sweep(millis(call.rules.abandon_after()), now_ms);
        self.admit(call, now_ms, now)?;
        let places = users.iter().map(|user| self.room_place(user, now_ms, now)).collect();
        let figures = self.figures_at(now_ms);
        Ok(RoomView { figures, places })
    }

    fn admit(&mut self, call: RoomCall<'_>, now_ms: u64, now: Instant) -> Result<(), LedgerError> {
        self.room.live.retain(|_, expires| *expires > now_ms);
        if self.closed || self.remaining == 0 || self.room.draw.is_none() {
            return Ok(());
        }
        let rate = f64::from(call.rules.admit_per_s);
        let capacity = (rate * ROOM_BUCKET_SECONDS).max(1.0);
        let (level, at) = self.room.bucket.unwrap_or((capacity, now_ms));
        let mut bucket = capacity.min(level + now_ms.saturating_sub(at) as f64 * rate / 1000.0);
        let room_for = call.rules.live_cap(self.remaining).saturating_sub(self.room.live.len() as u64);
        let admits = (bucket.floor() as u64).min(room_for).min(ROOM_ADMITS_PER_CALL_MAX);
        let ttl = call.rules.ticket_ttl();
        for _ in 0..admits {
            let Some((position, user)) = self.room.line.pop_first() else { break };
            self.room.positions.remove(&user);
            self.room.admitted += 1;
            let token = SubmitToken::generate()
                .map_err(|e| LedgerError::Unavailable(format!("no secure random source for a ticket: {e}")))?;
            let expires_at_ms = now_ms + millis(ttl);
            self.store_token(&token, &user, now + ttl, now);
            self.token_holders.insert(user.clone(), (token.clone(), now + ttl));
            self.room.tickets.insert(user.clone(), (token, expires_at_ms));
            self.room.live.insert(user.clone(), expires_at_ms);
            self.room.seen.remove(&user);
            let admission = Admission {
                seq: self.room.admitted,
                position,
                user: user.as_str().to_owned(),
                at_ms: now_ms,
                remaining: self.remaining,
                live: self.room.live.len() as u64,
            };
            self.room.log.push(admission);
            bucket -= 1.0;
        }
        self.room.bucket = Some((bucket, now_ms));
        Ok(())
    }

    fn room_place(&mut self, user: &UserId, now_ms: u64, now: Instant) -> Place {
        if let Some((token, expires_at_ms)) = self.room.tickets.get(user).cloned() {
            let unspent = self.tokens.get(&token).is_some_and(|(owner, until)| owner == user && *until > now);
            if expires_at_ms > now_ms && unspent {
                return Place::Admitted { token, expires_at_ms };
            }
            self.room.tickets.remove(user);
        }
        if let Some(position) = self.room.positions.get(user) {
            let ahead = self.room.line.range(..*position).count() as u64;
            return Place::Waiting { position: *position, ahead };
        }
        if self.room.pre.contains(user) {
            return Place::PreQueue;
        }
        Place::Absent
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
