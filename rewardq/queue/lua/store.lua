-- store: file one output record of a trajectory, and say whether the trajectory is complete.
-- KEYS: traj, stream, waiting, done
-- ARGV: group, entry_id, tid, index, final(0|1), digest, incomplete_timeout, lease_seconds,
--       worker, reward_prefix, result_ttl, done_maxlen, max_outputs, max_trajectory_bytes,
--       size (the record's bytes), inline_bytes, blob (the record's blob key, or '': rewardq/queue/blobs.py),
--       legacy_digest, life (the worker's process life: see take_lease in common.lua)
--   digest: the worker's short hash of the record bytes (kept per output as h:<i>, so a later
--   record for a finished key is told apart from a redelivery of the same one, and two records
--   for one key are compared without reading either); legacy_digest: the same record's digest in
--   the form earlier versions stored (rewardq/queue/digests.py), compared with a stored digest of
--   that form, or '' (a stored digest is then compared with `digest` only).
-- Where a record is kept: one of at most inline_bytes is copied into the hash (o:<i>) and its
-- entry deleted. A larger one is never read by this script: it stays in its stream entry,
-- acknowledged, and the hash names that entry (r:<i>; `refs` counts them) until the trajectory
-- ends (`end_records` deletes the entries). Copying tens of MB through Lua blocks Redis for
-- every client for up to a second; a reference costs a few bytes. A record that came as a blob
-- is always kept by reference: the hash names its blob too (b:<i>), which loses its TTL and is
-- deleted with the entry. The blob of an entry dropped here (a duplicate) is deleted with it; a
-- duplicate listed in `acks` (its trajectory is complete) has its blob listed in `ack_blobs`, which
-- every ending deletes with the entries (`ack_recorded`).
-- Returns one of
--   {'parked', stored, final}      data kept; the entry is acked (and deleted unless referenced)
--   {'complete', final, attempts, solo, shared, p0, .., pn} this caller now holds the lease and
--                                  must score + commit (solo, shared: see take_lease in common.lua);
--                                  each p is the record's bytes, or {entry_id} for a record kept in
--                                  its stream entry (the caller reads it there; {false}: gone)
--   {'leased', holder}             another live worker is scoring it; leave the entry pending
--   {'done', 0}                    the same record again, for a finished trajectory, or any record
--                                  of a cancelled one (never scored); entry acked
--   {'conflict', reason[, late]}   the record contradicts what is stored, or arrived after its
--                                  trajectory finished (late: 'kept' when its key has a result,
--                                  which stays, else 'open'); the caller dead-letters it (`fail`),
--                                  which never overwrites an existing result
--   {'toolarge', reason}           storing it would take the trajectory's records (`bytes`) past
--                                  max_trajectory_bytes; nothing stored, the caller fails it
-- Budget: O(1) calls and at most inline_bytes copied, plus on completion one HMGET of
-- 2 * (final+1) <= 2 * max_outputs fields (the reply carries the inline payloads); a `whole`
-- trajectory reads none of its records. Nothing loops over a count the record sets beyond
-- max_outputs. Flags: allow-oom (rewardq/queue/scripts.py): it adds at most inline_bytes and a
-- few small fields, and it is what lets a trajectory be scored and its records freed.
local traj, stream, waiting, done = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, id, tid = ARGV[1], ARGV[2], ARGV[3]
local index, is_final, digest = tonumber(ARGV[4]), ARGV[5] == '1', ARGV[6]
local incomplete_timeout, lease_seconds = tonumber(ARGV[7]), tonumber(ARGV[8])
local worker, rprefix, ttl = ARGV[9], ARGV[10], tonumber(ARGV[11])
local max_out, max_bytes = tonumber(ARGV[13]), tonumber(ARGV[14])
local size, inline_max, blob = tonumber(ARGV[15]), tonumber(ARGV[16]), ARGV[17] or ''
local by_ref = size > inline_max or blob ~= ''
local legacy = ARGV[18] or ''
local life = ARGV[19] or ''
-- Whether a stored digest (false: none) is this record's, in either form.
local function same_record(had)
  return had == digest or (legacy ~= '' and had == legacy)
end
-- Drop this entry: acknowledged and deleted, with its blob.
local function drop()
  ack_delete(stream, group, {id})
  if blob ~= '' then redis.call('DEL', blob) end
end
local now = now_seconds()

if not index or index < 0 or index >= max_out then
  return {'conflict', 'output index ' .. ARGV[4] .. ' is not in 0..' .. (max_out - 1) .. ' (max_outputs=' .. max_out .. ')'}
end

local state = redis.call('HGET', traj, 'state')
if state == 'done' then
  if redis.call('HGET', traj, 'status') == 'cancelled' then  -- nobody wants it scored (lua/cancel.lua)
    drop()
    return {'done', 0}
  end
  local key = tid .. '_' .. index
  local had = redis.call('HGET', traj, 'h:' .. index)
  if had and same_record(had) then  -- the record it finished with, delivered again
    drop()
    return {'done', 0}
  end
  local st = redis.call('HGET', traj, 'status') or 'ok'
  local why = redis.call('HGET', traj, 'error') or ''
  local status = st .. (why ~= '' and (': ' .. why) or '')
  local has_result = redis.call('EXISTS', rprefix .. key) == 1
  local kept = has_result and '; its existing result is kept' or ''
  local late = has_result and 'kept' or 'open'
  if had then
    return {'conflict', 'a different record for key ' .. key .. ' arrived after its trajectory finished (' ..
            status .. ')' .. kept, late}
  end
  return {'conflict', 'output ' .. index .. ' arrived after its trajectory finished (' .. status .. ')' .. kept, late}
end

-- A small record is read from the stream entry itself: the worker validated its copy, and
-- sending the bytes back would double the traffic. A large one is not read at all: XCLAIM JUSTID
-- (no delivery counted, no bytes returned) says whether its entry is still there and pending.
local payload
if by_ref then
  if #redis.call('XCLAIM', stream, group, worker, 0, id, 'JUSTID') == 0 then
    redis.call('XACK', stream, group, id)
    return {'done', 0}  -- deleted or acknowledged meanwhile: another worker already filed it
  end
else
  local entry = redis.call('XRANGE', stream, id, id)
  if #entry == 0 then
    redis.call('XACK', stream, group, id)
    return {'done', 0}  -- deleted meanwhile: another worker already filed it
  end
  local ef = entry[1][2]
  for j = 1, #ef, 2 do
    if ef[j] == 'data' then payload = ef[j + 1] end
  end
  if not payload then
    return {'conflict', 'stream entry ' .. id .. ' has no data field'}
  end
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
  if whole[index + 1] ~= id and not same_record(redis.call('HGET', traj, 'h:' .. index)) then
    return {'conflict', 'two different records for key ' .. tid .. '_' .. index}
  end
  if not add_ack(traj, id, max_out) then
    drop()  -- one more copy of a listed record: nothing to keep it for
    return {'done', 0}
  end
  add_ack_blob(traj, index, blob)
  local holder, attempts, solo, shared = take_lease(traj, worker, life, now, lease_seconds)
  if holder then return {'leased', holder} end
  local out = {'complete', final_i, attempts, solo, shared}
  for _, wid in ipairs(whole) do out[#out + 1] = {wid} end  -- the caller reads them in the stream
  return out
end

local field, ref = 'o:' .. index, 'r:' .. index
local had = redis.call('HGET', traj, 'h:' .. index)
local existing = redis.call('HEXISTS', traj, field) == 1 or redis.call('HEXISTS', traj, ref) == 1
if existing and had and not same_record(had) then
  return {'conflict', 'two different records for key ' .. tid .. '_' .. index}
end
if not existing then
  local have = tonumber(redis.call('HGET', traj, 'bytes') or '0')
  if have + size > max_bytes then
    return {'toolarge', 'trajectory ' .. tid .. ': storing output ' .. index .. ' (' .. size ..
            ' bytes) would take its records to ' .. (have + size) .. ' bytes, over max_trajectory_bytes=' ..
            max_bytes .. '; send fewer or shorter outputs, or raise max_trajectory_bytes on producers and workers'}
  end
end
local final = redis.call('HGET', traj, 'final')
if is_final then
  if final and tonumber(final) ~= index then
    return {'conflict', 'two outputs marked final: ' .. final .. ' and ' .. index}
  end
  if not final then
    local hi = highest_index(traj, max_out)
    if hi > index then
      return {'conflict', 'output ' .. hi .. ' has an index beyond the final output ' .. index}
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
  redis.call('HINCRBY', traj, 'bytes', size)
  if by_ref then
    redis.call('HSET', traj, ref, id, 'h:' .. index, digest)
    redis.call('HINCRBY', traj, 'refs', 1)
    if blob ~= '' then
      redis.call('HSET', traj, 'b:' .. index, blob)
      redis.call('PERSIST', blob)
    end
  else
    redis.call('HSET', traj, field, payload, 'h:' .. index, digest)
  end
  redis.call('HINCRBY', traj, 'stored', 1)
  if index > tonumber(redis.call('HGET', traj, 'hi') or '-1') then redis.call('HSET', traj, 'hi', index) end
end
redis.call('HSETNX', traj, 'first_seen', string.format('%.6f', now))
redis.call('HSETNX', traj, 'state', 'collecting')
redis.call('HSET', traj, 'last_seen', string.format('%.6f', now))

-- This entry is done with: acknowledged, and deleted unless the hash names it (its record's home).
local function settle()
  if redis.call('HGET', traj, ref) == id then
    redis.call('XACK', stream, group, id)
  else
    drop()
  end
end

local stored = tonumber(redis.call('HGET', traj, 'stored'))
if final and stored == tonumber(final) + 1 then
  if not add_ack(traj, id, max_out) then
    settle()  -- its data is kept; a listed entry stays pending
    return {'done', 0}
  end
  add_ack_blob(traj, index, blob)  -- a duplicate's blob ends with its entry
  local holder, attempts, solo, shared = take_lease(traj, worker, life, now, lease_seconds)
  if holder then return {'leased', holder} end
  redis.call('ZREM', waiting, tid)
  local fields = {}
  for i = 0, tonumber(final) do
    fields[#fields + 1] = 'o:' .. i
    fields[#fields + 1] = 'r:' .. i
  end
  local out = {'complete', final, attempts, solo, shared}
  local got = hmget_all(traj, fields)
  for j = 1, #got, 2 do out[#out + 1] = got[j] or {got[j + 1]} end
  return out
end

redis.call('ZADD', waiting, now + incomplete_timeout, tid)
settle()
return {'parked', stored, final or -1}
