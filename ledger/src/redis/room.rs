//! The waiting room on Redis: one run of `room.lua` per join or tick, and the admissions log.

use ::redis::Value;

use super::scripts::ROOM;
use super::RedisLedger;
use crate::room::{ROOM_ADMITS_PER_CALL_MAX, ROOM_BUCKET_SECONDS, ROOM_KEYS_TTL, ROOM_TICK_USERS_MAX};
use crate::*;

impl RedisLedger {
    pub(super) async fn room_call(
        &self,
        sku: &SkuId,
        mode: &str,
        call: RoomCall<'_>,
        users: &[UserId],
    ) -> Result<RoomView, LedgerError> {
        assert!(users.len() <= ROOM_TICK_USERS_MAX, "a room call names at most ROOM_TICK_USERS_MAX buyers");
        let keys = self.keys(sku);
        let mut invocation = ROOM.key(&keys.meta);
        invocation.arg(mode).arg(call.starts_at_ms.map(|ms| ms.to_string()).unwrap_or_default());
        invocation.arg(call.rules.admit_per_s).arg(call.rules.admit_factor);
        invocation.arg(millis(call.rules.ticket_ttl())).arg(millis(call.rules.abandon_after()));
        invocation.arg(call.seed).arg(ROOM_BUCKET_SECONDS).arg(ROOM_ADMITS_PER_CALL_MAX).arg(millis(ROOM_KEYS_TTL));
        for user in users {
            invocation.arg(user.as_str());
        }
        let reply: Vec<Value> = self.write(sku, &invocation).await?;
        parse_view(&reply, users.len())
    }

    pub(super) async fn room_log(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<Admission>, LedgerError> {
        let keys = self.keys(sku);
        let (Ok(start), Ok(limit)) = (isize::try_from(after), isize::try_from(limit.max(1))) else {
            return Ok(Vec::new());
        };
        let mut command = ::redis::cmd("LRANGE");
        command.arg(format!("{}room:log", keys.meta.trim_end_matches("meta"))).arg(start).arg(start + limit - 1);
        let lines: Vec<String> = self.read(sku, &command).await?;
        lines.iter().map(|line| parse_admission(line)).collect()
    }
}

impl RedisLedger {
    /// `room.lua`'s figures, read in one pipeline (one slot) without running it.
    pub(super) async fn read_room(&self, sku: &SkuId) -> Result<Option<RoomFigures>, LedgerError> {
        let keys = self.keys(sku);
        let base = keys.meta.trim_end_matches("meta").to_string();
        let now_ms = crate::unix_ms();
        let mut pipe = ::redis::pipe();
        pipe.cmd("HMGET").arg(&keys.meta).arg("total").arg("remaining").arg("closed");
        pipe.cmd("HMGET")
            .arg(format!("{base}room"))
            .arg("seed")
            .arg("drawn_at")
            .arg("placed")
            .arg("admitted")
            .arg("next");
        pipe.cmd("ZCARD").arg(format!("{base}room:line"));
        pipe.cmd("SCARD").arg(format!("{base}room:pre"));
        pipe.cmd("ZCOUNT").arg(format!("{base}room:live")).arg(format!("({now_ms}")).arg("+inf");
        pipe.cmd("ZRANGE").arg(format!("{base}room:line")).arg(0).arg(0).arg("WITHSCORES");
        type Reply = (Vec<Option<String>>, Vec<Option<String>>, u64, u64, u64, Vec<String>);
        let mut con = self.connection();
        let (meta, room, line, pre, live, head): Reply = self.call(Some(sku), pipe.query_async(&mut con)).await?;
        let number = |field: &Option<String>| field.as_deref().and_then(|text| text.parse::<u64>().ok());
        if meta.first().is_none_or(Option::is_none) {
            return Err(LedgerError::Missing(sku.clone()));
        }
        let ran = room.iter().any(Option::is_some) || pre > 0;
        if !ran {
            return Ok(None);
        }
        let draw = room[0].clone().map(|seed| Draw {
            seed,
            at_ms: number(&room[1]).unwrap_or(0),
            placed: number(&room[2]).unwrap_or(0),
        });
        Ok(Some(RoomFigures {
            now_ms,
            remaining: meta.get(1).and_then(number).unwrap_or(0),
            closed: meta.get(2).is_some_and(|closed| closed.as_deref() == Some("1")),
            waiting: if draw.is_some() { line } else { pre },
            draw,
            admitted: number(&room[3]).unwrap_or(0),
            live,
            head: head.get(1).and_then(|position| position.parse::<u64>().ok()),
        }))
    }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn corrupt(what: &str) -> LedgerError {
    LedgerError::Corrupt(format!("room.lua answered an unreadable {what}"))
}

fn int(value: Option<&Value>, what: &str) -> Result<u64, LedgerError> {
    match value {
        Some(Value::Int(n)) => u64::try_from(*n).map_err(|_| corrupt(what)),
        _ => Err(corrupt(what)),
    }
}

fn text(value: Option<&Value>, what: &str) -> Result<String, LedgerError> {
    match value {
        Some(Value::BulkString(bytes)) => String::from_utf8(bytes.clone()).map_err(|_| corrupt(what)),
        Some(Value::SimpleString(text)) => Ok(text.clone()),
        _ => Err(corrupt(what)),
    }
}

fn parse_view(reply: &[Value], users: usize) -> Result<RoomView, LedgerError> {
    const FIGURES: usize = 10;
    if reply.len() != FIGURES + 3 * users {
        return Err(corrupt("reply length"));
    }
    let seed = text(reply.get(3), "seed")?;
    let figures = RoomFigures {
        now_ms: int(reply.first(), "clock")?,
        remaining: int(reply.get(1), "remaining")?,
        closed: int(reply.get(2), "closed")? == 1,
        draw: (!seed.is_empty())
            .then(|| {
                Ok::<_, LedgerError>(Draw {
                    seed,
                    at_ms: int(reply.get(4), "draw time")?,
                    placed: int(reply.get(5), "draw count")?,
                })
            })
            .transpose()?,
        waiting: int(reply.get(6), "waiting count")?,
        admitted: int(reply.get(7), "admissions")?,
        live: int(reply.get(8), "live tickets")?,
        head: Some(int(reply.get(9), "line head")?).filter(|head| *head > 0),
    };
    let places = reply[FIGURES..]
        .chunks(3)
        .map(|entry| match int(entry.first(), "place")? {
            0 => Ok(Place::Absent),
            1 => Ok(Place::PreQueue),
            2 => Ok(Place::Waiting { position: int(entry.get(1), "position")?, ahead: int(entry.get(2), "ahead")? }),
            3 => Ok(Place::Admitted {
                token: SubmitToken::new(&text(entry.get(1), "ticket token")?).map_err(|_| corrupt("ticket token"))?,
                expires_at_ms: int(entry.get(2), "ticket expiry")?,
            }),
            _ => Err(corrupt("place")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RoomView { figures, places })
}

/// One `room:log` entry: `seq position user at remaining live` (user ids hold no space).
fn parse_admission(line: &str) -> Result<Admission, LedgerError> {
    let fields: Vec<&str> = line.split(' ').collect();
    let number =
        |index: usize| fields.get(index).and_then(|field| field.parse().ok()).ok_or_else(|| corrupt("admission"));
    Ok(Admission {
        seq: number(0)?,
        position: number(1)?,
        user: fields.get(2).ok_or_else(|| corrupt("admission"))?.to_string(),
        at_ms: number(3)?,
        remaining: number(4)?,
        live: number(5)?,
    })
}
