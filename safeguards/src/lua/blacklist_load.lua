-- Reads the whole blacklist with each entry's remaining time, measured on Redis' clock, and
-- drops expired entries on the way (they block no one, so the version stays).
--
-- KEYS[1] entries   KEYS[2] version counter
-- Returns {version, member_1, remaining_ms_1 (-1 = until removed), ...}.

local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = { tonumber(redis.call('GET', KEYS[2]) or '0') }
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  out[#out + 1] = entries[i]
  local score = entries[i + 1]
  if score == 'inf' then
    out[#out + 1] = -1
  else
    out[#out + 1] = math.max(0, tonumber(score) - now)
  end
end
return out
