-- store: file one output record of a trajectory, and say whether the trajectory is complete.
-- KEYS: traj, stream, waiting, done
-- ARGV: group, entry_id, tid, index, final(0|1), '' (unused), incomplete_timeout, lease_seconds,
--       worker, reward_prefix, result_ttl, done_maxlen
-- Returns one of
--   {'parked', stored, final}      data kept in the hash; the entry is acked and deleted
--   {'complete', final, attempts, p0, .., pn} this caller now holds the lease and must score + commit
--   {'leased', holder}             another live worker is scoring it; leave the entry pending
--   {'done', wrote}                already finished; entry acked (wrote=1: this key got an error result)
--   {'conflict', reason}           the record contradicts what is stored; caller fails the trajectory
local traj, stream, waiting, done = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, id, tid = ARGV[1], ARGV[2], ARGV[3]
local index, is_final = tonumber(ARGV[4]), ARGV[5] == '1'
local incomplete_timeout, lease_seconds = tonumber(ARGV[7]), tonumber(ARGV[8])
local worker, rprefix, ttl = ARGV[9], ARGV[10], tonumber(ARGV[11])
local now = now_seconds()

local state = redis.call('HGET', traj, 'state')
if state == 'done' then
  local rkey = rprefix .. tid .. '_' .. index
  local wrote = 0
  if redis.call('EXISTS', rkey) == 0 then
    local st = redis.call('HGET', traj, 'status') or 'ok'
    local why = redis.call('HGET', traj, 'error') or ''
    write_error(rkey, 'output ' .. index .. ' arrived after its trajectory finished (' .. st ..
                (why ~= '' and (': ' .. why) or '') .. ')', worker, now, ttl)
    wrote = 1
  end
  ack_delete(stream, group, {id})
  return {'done', wrote}
end

-- The record is read from the stream entry itself: the worker validated its copy, and
-- sending the bytes back would double the traffic.
local entry = redis.call('XRANGE', stream, id, id)
if #entry == 0 then
  redis.call('XACK', stream, group, id)
  return {'done', 0}  -- deleted meanwhile: another worker already filed it
end
local payload
local ef = entry[1][2]
for j = 1, #ef, 2 do
  if ef[j] == 'data' then payload = ef[j + 1] end
end
if not payload then
  return {'conflict', 'stream entry ' .. id .. ' has no data field'}
end

local whole = whole_ids(traj)
if whole then  -- claimed whole by a worker (lua/claim.lua); this is a redelivery or a late duplicate
  local final_i = #whole - 1
  if index > final_i then
    return {'conflict', 'output ' .. index .. ' has an index beyond the final output ' .. final_i}
  end
  if is_final and index ~= final_i then
    return {'conflict', 'two outputs marked final: ' .. final_i .. ' and ' .. index}
  end
  if whole[index + 1] ~= id and entry_data(stream, whole[index + 1]) ~= payload then
    return {'conflict', 'two different records for key ' .. tid .. '_' .. index}
  end
  add_ack(traj, id)
  local holder, attempts = take_lease(traj, worker, now, lease_seconds)
  if holder then return {'leased', holder} end
  local out = {'complete', final_i, attempts}
  for _, wid in ipairs(whole) do
    local data = entry_data(stream, wid)
    if not data then return {'conflict', 'stored output entry ' .. wid .. ' of ' .. tid .. ' vanished'} end
    out[#out + 1] = data
  end
  return out
end

local field = 'o:' .. index
local existing = redis.call('HGET', traj, field)
if existing and existing ~= payload then
  return {'conflict', 'two different records for key ' .. tid .. '_' .. index}
end
local final = redis.call('HGET', traj, 'final')
if is_final then
  if final and tonumber(final) ~= index then
    return {'conflict', 'two outputs marked final: ' .. final .. ' and ' .. index}
  end
  if not final then
    local stored = redis.call('HKEYS', traj)
    for _, f in ipairs(stored) do
      if string.sub(f, 1, 2) == 'o:' and tonumber(string.sub(f, 3)) > index then
        return {'conflict', 'output ' .. string.sub(f, 3) .. ' has an index beyond the final output ' .. index}
      end
    end
    redis.call('HSET', traj, 'final', index)
    final = tostring(index)
  end
elseif final and index > tonumber(final) then
  return {'conflict', 'output ' .. index .. ' has an index beyond the final output ' .. final}
elseif final and index == tonumber(final) then
  return {'conflict', 'output ' .. index .. ' is the final index but is not marked final'}
end

if not existing then
  redis.call('HSET', traj, field, payload)
  redis.call('HINCRBY', traj, 'stored', 1)
end
redis.call('HSETNX', traj, 'first_seen', string.format('%.6f', now))
redis.call('HSETNX', traj, 'state', 'collecting')
redis.call('HSET', traj, 'last_seen', string.format('%.6f', now))

local stored = tonumber(redis.call('HGET', traj, 'stored'))
if final and stored == tonumber(final) + 1 then
  add_ack(traj, id)
  local holder, attempts = take_lease(traj, worker, now, lease_seconds)
  if holder then return {'leased', holder} end
  redis.call('ZREM', waiting, tid)
  local fields = {}
  for i = 0, tonumber(final) do fields[#fields + 1] = 'o:' .. i end
  local out = {'complete', final, attempts}
  local payloads = redis.call('HMGET', traj, unpack(fields))
  for i = 1, #payloads do out[#out + 1] = payloads[i] end
  return out
end

redis.call('ZADD', waiting, now + incomplete_timeout, tid)
ack_delete(stream, group, {id})
return {'parked', stored, final or -1}
