-- claimable: of the idle pending entries given, those another worker may take over now.
-- An entry whose trajectory is leased to another worker until later is left alone: its owner
-- is scoring it (or died less than lease_seconds ago); claiming it would only count a delivery.
-- KEYS: stream   ARGV: traj_prefix, worker, max_key_bytes, byte_budget, id...
-- Budget: one XRANGE per id given (the worker gives at most its batch size); it stops vetting
-- once the entries read total byte_budget bytes (the ids left are vetted on a later pass), so it
-- copies at most byte_budget bytes plus one entry. A `key` field longer than max_key_bytes bytes is
-- not parsed (its entry is claimable).
local stream, tprefix, worker = KEYS[1], ARGV[1], ARGV[2]
local max_key, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_seconds()
local out = {}
local read = 0
for i = 5, #ARGV do
  if read >= budget then break end
  local id = ARGV[i]
  local ok = true
  local e = redis.call('XRANGE', stream, id, id)
  if #e > 0 then
    local f, key = e[1][2], nil
    for j = 1, #f, 2 do
      read = read + #f[j] + #f[j + 1]
      if f[j] == 'key' then key = f[j + 1] end
    end
    local tid = key and #key <= max_key and string.match(key, '^(.+)_%d+$')
    if tid then
      local lease = redis.call('HMGET', tprefix .. tid, 'lease', 'lease_until')
      if lease[1] and lease[1] ~= worker and tonumber(lease[2] or '0') > now then ok = false end
    end
  end
  if ok then out[#out + 1] = id end
end
return out
