-- claimable: of the idle pending entries given, those another worker may take over now.
-- An entry whose trajectory is leased to another worker until later is left alone: its owner
-- is scoring it (or died less than lease_seconds ago); claiming it would only count a delivery.
-- A lease of this worker's own name is claimable, whichever life took it: this life's own entries,
-- or those of an earlier process under this name, which died (take_lease takes its lease over).
-- An entry of a cancelled trajectory is acknowledged and deleted here instead: never scored.
-- KEYS: stream   ARGV: traj_prefix, worker, group, then pairs: id, tid ('' when the worker found
--       no trajectory named in the entry, or no entry)
-- The worker read the entries itself (plain XRANGE) and names each one's trajectory: this script
-- reads no entry, so a large record is never copied through Lua.
-- Budget: one HMGET per pair given (the worker gives at most its batch size).
local stream, tprefix, worker, group = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local now = now_seconds()
local out = {}
for i = 4, #ARGV - 1, 2 do
  local id, tid = ARGV[i], ARGV[i + 1]
  local ok = true
  if tid ~= '' then
    local lease = redis.call('HMGET', tprefix .. tid, 'lease', 'lease_until', 'status')
    if lease[1] and lease[1] ~= worker and tonumber(lease[2] or '0') > now then ok = false end
    if lease[3] == 'cancelled' then  -- nobody wants it scored (lua/cancel.lua): dropped, not claimed
      redis.call('XACK', stream, group, id)
      redis.call('XDEL', stream, id)
      ok = false
    end
  end
  if ok then out[#out + 1] = id end
end
return out
