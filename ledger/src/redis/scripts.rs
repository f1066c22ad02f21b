//! The Lua scripts in `lua/`, one per write: each runs as one atomic step on the server. A
//! script is sent by its SHA1 (`EVALSHA`) and loaded the first time a server does not know it
//! (`NOSCRIPT`): by redis-rs for a plain call, by `RedisLedger::write` for a fenced one.

use std::sync::LazyLock;

use ::redis::Script;

pub(super) static CONFIRM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/confirm.lua")));
pub(super) static CREATE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/create.lua")));
pub(super) static RESTOCK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/restock.lua")));
pub(super) static CLOSE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/close.lua")));
pub(super) static END_EPOCH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/end_epoch.lua")));
pub(super) static TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/token.lua")));
pub(super) static PRICING: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/pricing.lua")));
pub(super) static TRANSFER_OUT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/transfer_out.lua")));
pub(super) static TRANSFER_IN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/transfer_in.lua")));
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/release.lua")));
pub(super) static ROOM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/room.lua")));
